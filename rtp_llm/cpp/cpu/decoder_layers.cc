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
//
// LoRA adapters (rtp_llm/lora/layers.py): each linear layer's output gets its adapter groups' deltas from
// lora_add_, the kernel the Python layers call too; gate_up then runs without the SiLU epilogue (its output, the
// deltas, then the activation; gated panels' column order kept), the bits of CpuOps.mlp with adapters.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <tuple>
#include <vector>

#include "rtp_llm/cpp/cpu/ops.h"

namespace rtp_llm {
namespace {

// Per layer, `weights` holds these, in this order (None where the model has no such tensor, or the layer keeps
// no such copy), and `sizes` per linear layer its output features and the rows up to which its GEMV copy serves.
// Python builds both lists by the names below (decoder_layer_slots / decoder_layer_linears), never by position.
enum Slot : int64_t {
    kInputNorm, kQkvW, kQkvP, kQkvB, kQNorm, kKNorm, kOW, kOP, kOB, kPostNorm, kGateUpW, kGateUpP, kGateUpB,
    kDownW, kDownP, kDownB, kSlots
};
enum Linear : int64_t { kQkv, kO, kGateUp, kDown, kLinears };

// The slots' names, in Slot order: "<part>" for a norm's weight, "<linear>.<plain|packed|bias>" for a linear's.
constexpr const char* kSlotNames[] = {
    "input_norm", "qkv.plain", "qkv.packed", "qkv.bias", "q_norm", "k_norm", "o.plain", "o.packed", "o.bias",
    "post_norm", "gate_up.plain", "gate_up.packed", "gate_up.bias", "down.plain", "down.packed", "down.bias"};
static_assert(sizeof(kSlotNames) / sizeof(kSlotNames[0]) == kSlots, "a name per slot");
constexpr const char* kLinearNames[] = {"qkv", "o", "gate_up", "down"};
static_assert(sizeof(kLinearNames) / sizeof(kLinearNames[0]) == kLinears, "a name per linear layer");

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
        TORCH_CHECK(t.has_value(), "decoder_layers: layer ", layer, " lacks its ", kSlotNames[s], " weight");
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

// The step's adapter groups: rows[g] the flat-batch rows of group g; per (layer, linear, group) its adapter's
// packed a, b and tiles (None where the adapter has no such module), added by lora_add_ (lora_add.cc).
struct LoRADeltas {
    const c10::List<at::Tensor>& rows;
    const c10::List<std::optional<at::Tensor>>& w;
    int64_t groups;
    std::vector<std::vector<at::Tensor>> local;  // per piece, per group: its rows within the piece

    bool active() const { return groups > 0; }
    void cut(int64_t r0, int64_t n) {
        std::vector<at::Tensor> per;
        for (int64_t g = 0; g < groups; ++g) {
            const at::Tensor r = rows.get(g);
            per.push_back(r.masked_select((r >= r0) & (r < r0 + n)) - r0);
        }
        local.push_back(std::move(per));
    }
    // y += the deltas of layer's linear l on input x, the rows of piece j.
    void add(int64_t layer, Linear l, size_t j, const at::Tensor& x, at::Tensor& y) const {
        c10::List<std::optional<at::Tensor>> r;
        c10::List<at::Tensor> a, b, tiles;
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t base = ((layer * kLinears + l) * groups + g) * 3;
            const std::optional<at::Tensor> ag = w.get(base), bg = w.get(base + 1), tg = w.get(base + 2);
            if (!ag.has_value() || !ag->defined() || local[j][g].numel() == 0) continue;
            r.push_back(local[j][g]);
            a.push_back(*ag);
            b.push_back(*bg);
            tiles.push_back(*tg);
        }
        if (!a.empty()) lora_add_(y, x, r, a, b, tiles);
    }
};

// gate_up in gated panels' column order (per block of 24: gate then up), bias put in that order
// (CpuLinear._gate_up), for silu_and_mul_gated after the LoRA deltas.
at::Tensor gated_gate_up(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                         int64_t out_features) {
    const int64_t inter = out_features / 2, blocks = (inter + 23) / 24, pad = blocks * 24 - inter;
    std::optional<at::Tensor> b;
    if (bias) {
        b = at::constant_pad_nd(bias->view({2, inter}), {0, pad}).view({2, blocks, 24}).transpose(0, 1).reshape(-1);
    }
    return rtp_llm::linear(x, std::nullopt, packed, b, blocks * 48, 0);
}

}  // namespace

std::vector<std::string> decoder_layer_slots() { return {std::begin(kSlotNames), std::end(kSlotNames)}; }

std::vector<std::string> decoder_layer_linears() { return {std::begin(kLinearNames), std::end(kLinearNames)}; }

std::tuple<at::Tensor, at::Tensor> decoder_layers(
    const at::Tensor& x_in, const c10::List<std::optional<at::Tensor>>& weights, at::IntArrayRef sizes,
    const at::Tensor& kv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
    const at::Tensor& block_table, const at::Tensor& kv_lens, const std::optional<at::Tensor>& q_starts,
    int64_t num_heads, int64_t num_kv_heads, double eps, double scale, bool gated_mlp, int64_t piece_rows,
    const c10::List<at::Tensor>& lora_rows, const c10::List<std::optional<at::Tensor>>& lora_weights) {
    const int64_t layers = kv.size(0), tokens = x_in.size(0);
    LoRADeltas lora{lora_rows, lora_weights, static_cast<int64_t>(lora_rows.size()), {}};
    TORCH_CHECK(static_cast<int64_t>(lora_weights.size()) == layers * kLinears * lora.groups * 3,
                "decoder_layers: 3 packed LoRA tensors per (layer, linear, group) expected");
    TORCH_CHECK(layers >= 1, "decoder_layers: no layers");
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

    // x: layer 0's input rows, then the running residual sum (updated in place); out: every later layer's input
    // rows, written by the layer before's down projection; qkv: the layer's q | k | v, rotated in place; h: a
    // norm's output; o: the o projection's. All [tokens, ...], made once and reused by every layer, and each
    // piece's views of them made once (a decode step is one piece: per layer, the tensor bookkeeping of
    // re-slicing them was a measurable share of its serial time). A layer's first half reads a piece of its
    // input before its second half writes that piece.
    at::Tensor x = x_in.clone();
    at::Tensor out = at::empty_like(x_in);
    at::Tensor qkv = at::empty({tokens, q_size + 2 * kv_size}, x_in.options());
    at::Tensor h_all = at::empty_like(x_in), o_all = at::empty_like(x_in);
    // The views and temporaries below need no autograd bookkeeping (the returned tensors were made above, as
    // ordinary tensors).
    c10::InferenceMode no_autograd;
    struct Piece {
        int64_t r0, n;
        at::Tensor x, out, rows, q, k, v, cos, sin, h, o;
    };
    std::vector<Piece> pieces;
    for (int64_t r0 = 0; r0 < tokens; r0 += piece) {
        const int64_t n = std::min(piece, tokens - r0);
        const auto rows_of = [&](const at::Tensor& t) { return n == tokens ? t : t.narrow(0, r0, n); };
        Piece p{r0, n, rows_of(x), rows_of(out), rows_of(qkv)};
        p.q = p.rows.narrow(1, 0, q_size).view({n, num_heads, head_dim});
        p.k = p.rows.narrow(1, q_size, kv_size).view({n, num_kv_heads, head_dim});
        p.v = p.rows.narrow(1, q_size + kv_size, kv_size).view({n, num_kv_heads, head_dim});
        p.cos = rows_of(cos), p.sin = rows_of(sin), p.h = rows_of(h_all), p.o = rows_of(o_all);
        pieces.push_back(std::move(p));
        if (lora.active()) lora.cut(r0, n);
    }
    const auto q_all = qkv.narrow(1, 0, q_size).view({tokens, num_heads, head_dim});
    for (int64_t i = 0; i < layers; ++i) {
        const LayerWeights lw{weights, sizes, i};
        const auto gate_up_p = lw.opt(kGateUpP), o_p = lw.opt(kOP), qkv_p = lw.opt(kQkvP), down_p = lw.opt(kDownP);
        const auto next_qkv_p = i + 1 < layers ? LayerWeights{weights, sizes, i + 1}.opt(kQkvP) : std::nullopt;
        const at::Tensor input_norm = lw.req(kInputNorm), post_norm = lw.req(kPostNorm);
        auto layer_kv = kv.select(0, i);
        auto k_cache = layer_kv.select(0, 0), v_cache = layer_kv.select(0, 1);
        // norm -> qkv -> (q/k norms) -> RoPE and the KV write, piece by piece. Each GEMM's threads request the
        // first panels of the one after it (PanelsAfter).
        for (size_t j = 0; j < pieces.size(); ++j) {
            Piece& p = pieces[j];
            if (i == 0) {
                p.h.copy_(rms_norm(p.x, input_norm, eps));
            } else {
                add_rms_norm_into(p.out, p.x, input_norm, eps, p.h);
            }
            {
                PanelsAfter then(j + 1 < pieces.size() ? qkv_p : o_p);
                lw.linear_out(p.h, kQkv, kQkvW, p.rows);
            }
            if (lora.active()) lora.add(i, kQkv, j, p.h, p.rows);
            if (auto qn = lw.opt(kQNorm)) {  // Qwen3: per-head norms before RoPE, written back in place
                p.q.copy_(rms_norm(p.q.contiguous(), *qn, eps));
                p.k.copy_(rms_norm(p.k.contiguous(), lw.req(kKNorm), eps));
            }
            rotary_write_kv_(p.q, p.k, p.v, p.cos, p.sin, k_cache, v_cache, sp + p.r0);
        }
        const at::Tensor o_in =
            (prefill ? prefill_attention(q_all, k_cache, v_cache, block_table, *q_starts, kv_lens, scale)
                     : paged_attention(q_all, k_cache, v_cache, block_table, kv_lens, scale))
                .view({tokens, q_size});
        // o -> residual add + norm -> MLP, piece by piece, the down projection into out's rows.
        for (size_t j = 0; j < pieces.size(); ++j) {
            Piece& p = pieces[j];
            const at::Tensor o_rows = p.n == tokens ? o_in : o_in.narrow(0, p.r0, p.n);
            {
                PanelsAfter then(gate_up_p);
                lw.linear_out(o_rows, kO, kOW, p.o);
            }
            if (lora.active()) lora.add(i, kO, j, o_rows, p.o);
            add_rms_norm_into(p.o, p.x, post_norm, eps, p.h);
            at::Tensor act;
            {
                PanelsAfter then(down_p);
                if (lora.active() && gated_mlp) {  // the deltas' bt in the same column order (fused_layers.py)
                    at::Tensor gu = gated_gate_up(p.h, lw.req(kGateUpP), lw.opt(kGateUpB), lw.out_features(kGateUp));
                    lora.add(i, kGateUp, j, p.h, gu);
                    act = silu_and_mul_gated(gu, lw.out_features(kGateUp) / 2);
                } else if (lora.active()) {
                    at::Tensor gu = lw.linear(p.h, kGateUp, kGateUpW);
                    lora.add(i, kGateUp, j, p.h, gu);
                    act = silu_and_mul(gu);
                } else {
                    act = gated_mlp ? linear_silu(p.h, lw.req(kGateUpP), lw.opt(kGateUpB), lw.out_features(kGateUp) / 2)
                                    : silu_and_mul(lw.linear(p.h, kGateUp, kGateUpW));
                }
            }
            PanelsAfter then(j + 1 < pieces.size() ? o_p : next_qkv_p);
            lw.linear_out(act, kDown, kDownW, p.out);
            if (lora.active()) lora.add(i, kDown, j, act, p.out);
        }
    }
    return {out, x};
}

}  // namespace rtp_llm
