// Every decoder layer of a step in one call, for steps whose rows all go through one attention kernel: the paged
// kernel (decodes, short chunks after a cached prefix) or the prefill kernel (fresh prompts, longer chunks): see
// rtp_llm/device/cpu/attention.py. The kernels the Python layers (rtp_llm/models/decoder.py on CpuOps) would call
// one by one, on the same rows, each linear layer through the same call (linear.cc) on the same copies of its
// weight, so the result is bit-for-bit the same.
//
// Why: at small batches a step streams the weights at the memory bandwidth and everything else is overhead:
// ~18 Python-level torch calls per layer (views, splits, the KV write, the kernels' dispatch) during which the
// memory bus idles. From C++ the same work costs a few microseconds per layer (benchmarks/README.md). A prefill's
// rows go in pieces of `piece_rows` through everything but the attention (norms, qkv, RoPE, KV write; o, norm,
// MLP), so that each piece's intermediates stay in cache, and the residual, qkv and RoPE are updated in place:
// only the row-independent kernels (panels, GGUF blocks) are given pieces, so the bits do not change.
//
// With gated_mlp, gate_up's copy is in pack_gated_panels' row order (panels or GGUF blocks) and the SiLU runs in
// its epilogue (linear_silu, as CpuOps.mlp). No tensor parallelism; the KV cache in the model's dtype.
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "rtp_llm/cpp/cpu/ops.h"

namespace rtp_llm {
namespace {

// Per layer, `weights` holds these, in this order (None where the model has no such tensor, or the layer keeps
// no such copy: device/cpu/fused_layers.py builds the list), and `sizes` per linear layer its output features
// and the rows up to which its GEMV copy serves.
enum Slot : int64_t {
    kInputNorm, kQkvW, kQkvP, kQkvB, kQNorm, kKNorm, kOW, kOP, kOB, kPostNorm, kGateUpW, kGateUpP, kGateUpB,
    kDownW, kDownP, kDownB, kSlots
};
enum Linear : int64_t { kQkv, kO, kGateUp, kDown, kLinears };

struct LayerWeights {
    const c10::List<std::optional<at::Tensor>>& w;
    at::IntArrayRef sizes;
    int64_t layer;

    std::optional<at::Tensor> opt(Slot s) const {
        std::optional<at::Tensor> t = w.get(layer * kSlots + s);
        return t.has_value() && t->defined() ? t : std::nullopt;
    }
    at::Tensor req(Slot s) const {
        auto t = opt(s);
        TORCH_CHECK(t.has_value(), "decoder_layers: layer ", layer, " lacks weight #", static_cast<int64_t>(s));
        return *t;
    }
    int64_t out_features(Linear l) const { return sizes[(layer * kLinears + l) * 2]; }
    at::Tensor linear(const at::Tensor& x, Linear l, Slot plain) const {  // plain, packed, bias are consecutive
        return rtp_llm::linear(x, opt(plain), opt(static_cast<Slot>(plain + 1)), opt(static_cast<Slot>(plain + 2)),
                               out_features(l), sizes[(layer * kLinears + l) * 2 + 1]);
    }
    void linear_out(const at::Tensor& x, Linear l, Slot plain, at::Tensor& out) const {
        rtp_llm::linear_out(x, opt(plain), opt(static_cast<Slot>(plain + 1)), opt(static_cast<Slot>(plain + 2)),
                            out_features(l), sizes[(layer * kLinears + l) * 2 + 1], out);
    }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> decoder_layers(
    const at::Tensor& x_in, const c10::List<std::optional<at::Tensor>>& weights, at::IntArrayRef sizes,
    const at::Tensor& kv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
    const at::Tensor& block_table, const at::Tensor& kv_lens, const std::optional<at::Tensor>& q_starts,
    int64_t num_heads, int64_t num_kv_heads, double eps, double scale, bool gated_mlp, int64_t piece_rows) {
    const int64_t layers = kv.size(0), tokens = x_in.size(0);
    TORCH_CHECK(x_in.dim() == 2 && x_in.is_contiguous(), "decoder_layers: x must be contiguous [tokens, hidden]");
    TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kSlots, "decoder_layers: ", kSlots,
                " weight slots per layer expected for ", layers, " layers, got ", weights.size());
    TORCH_CHECK(static_cast<int64_t>(sizes.size()) == layers * kLinears * 2, "decoder_layers: ", kLinears * 2,
                " sizes per layer expected for ", layers, " layers, got ", sizes.size());
    TORCH_CHECK(kv.dim() == 6 && kv.size(1) == 2 && kv.size(4) == num_kv_heads && kv.is_contiguous() &&
                    kv.scalar_type() == x_in.scalar_type(),
                "decoder_layers: kv must be the contiguous [layers, 2, blocks, block_size, kv_heads, head_dim] "
                "buffer in x's dtype");
    TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == tokens,
                "decoder_layers: slots must be int64 [tokens]");
    TORCH_CHECK(cos.dim() == 2 && cos.size(0) == tokens && sin.sizes() == cos.sizes() && cos.is_contiguous() &&
                    sin.is_contiguous(),
                "decoder_layers: cos and sin must be contiguous [tokens, head_dim]");
    const int64_t head_dim = kv.size(5), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    const int64_t capacity = kv.size(2) * kv.size(3);
    const int64_t* sp = slots.data_ptr<int64_t>();
    for (int64_t t = 0; t < tokens; ++t)
        TORCH_CHECK(sp[t] >= 0 && sp[t] < capacity, "decoder_layers: slot ", sp[t], " outside [0, ", capacity, ")");
    const bool prefill = q_starts.has_value() && q_starts->defined();
    const int64_t piece = piece_rows > 0 ? piece_rows : std::max<int64_t>(tokens, 1);

    // x: each layer's input rows (then the down projection's output), residual: the running sum, qkv: the layer's
    // q | k | v, rotated in place; all [tokens, ...] and reused by every layer. A layer's first half reads x's
    // pieces before its second half writes them.
    at::Tensor x = x_in.clone();
    at::Tensor residual;
    at::Tensor qkv = at::empty({tokens, q_size + 2 * kv_size}, x_in.options());
    for (int64_t i = 0; i < layers; ++i) {
        const LayerWeights lw{weights, sizes, i};
        const auto gate_up_p = lw.opt(kGateUpP);
        const auto next_qkv_p = i + 1 < layers ? LayerWeights{weights, sizes, i + 1}.opt(kQkvP) : std::nullopt;
        auto layer_kv = kv.select(0, i);
        auto k_cache = layer_kv.select(0, 0), v_cache = layer_kv.select(0, 1);
        // norm -> qkv -> (q/k norms) -> RoPE -> the KV write, piece by piece. Each GEMM's threads request the
        // first panels of the one after it (PanelsAfter).
        for (int64_t r0 = 0; r0 < tokens; r0 += piece) {
            const int64_t n = std::min(piece, tokens - r0);
            at::Tensor h;
            if (i == 0) {
                h = rms_norm(x.narrow(0, r0, n), lw.req(kInputNorm), eps);
            } else {
                auto res = residual.narrow(0, r0, n);
                h = add_rms_norm_(x.narrow(0, r0, n), res, lw.req(kInputNorm), eps);
            }
            auto rows = qkv.narrow(0, r0, n);
            {
                PanelsAfter then(r0 + n < tokens ? lw.opt(kQkvP) : lw.opt(kOP));
                lw.linear_out(h, kQkv, kQkvW, rows);
            }
            auto q = rows.narrow(1, 0, q_size).view({n, num_heads, head_dim});
            auto k = rows.narrow(1, q_size, kv_size).view({n, num_kv_heads, head_dim});
            auto v = rows.narrow(1, q_size + kv_size, kv_size).view({n, num_kv_heads, head_dim});
            if (auto qn = lw.opt(kQNorm)) {  // Qwen3: per-head norms before RoPE, written back in place
                q.copy_(rms_norm(q.contiguous(), *qn, eps));
                k.copy_(rms_norm(k.contiguous(), lw.req(kKNorm), eps));
            }
            rotary_(q, k, cos.narrow(0, r0, n), sin.narrow(0, r0, n));
            write_kv_rows(k, k_cache, sp + r0);
            write_kv_rows(v, v_cache, sp + r0);
        }
        if (i == 0) residual = x;  // the embedding rows: layer 0's residual, updated in place from here on
        auto q_all = qkv.narrow(1, 0, q_size).view({tokens, num_heads, head_dim});
        const at::Tensor o_in =
            (prefill ? prefill_attention(q_all, k_cache, v_cache, block_table, *q_starts, kv_lens, scale)
                     : paged_attention(q_all.contiguous(), k_cache, v_cache, block_table, kv_lens, scale))
                .reshape({tokens, q_size});
        // o -> residual add + norm -> MLP, piece by piece, the down projection into x's rows.
        if (i == 0) x = at::empty_like(x_in);
        for (int64_t r0 = 0; r0 < tokens; r0 += piece) {
            const int64_t n = std::min(piece, tokens - r0);
            at::Tensor o;
            {
                PanelsAfter then(gate_up_p);
                o = lw.linear(o_in.narrow(0, r0, n), kO, kOW);
            }
            auto res = residual.narrow(0, r0, n);
            const at::Tensor h = add_rms_norm_(o, res, lw.req(kPostNorm), eps);
            at::Tensor act;
            {
                PanelsAfter then(lw.opt(kDownP));
                act = gated_mlp ? linear_silu(h, lw.req(kGateUpP), lw.opt(kGateUpB), lw.out_features(kGateUp) / 2)
                                : silu_and_mul(lw.linear(h, kGateUp, kGateUpW));
            }
            auto out = x.narrow(0, r0, n);
            PanelsAfter then(r0 + n < tokens ? lw.opt(kOP) : next_qkv_p);
            lw.linear_out(act, kDown, kDownW, out);
        }
    }
    return {x, residual};
}

}  // namespace rtp_llm
