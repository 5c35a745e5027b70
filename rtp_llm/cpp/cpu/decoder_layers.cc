// Every decoder layer of a step whose rows all go through the paged attention kernel (decodes, and short chunks
// after a cached prefix: rtp_llm/device/cpu/attention.py), in one call: the kernels the Python layers
// (rtp_llm/models/decoder.py on CpuOps) would call one by one, in the same order on the same tensors, each linear
// layer through the same call (linear.cc) on the same copies of its weight, so the result is bit-for-bit the
// same.
//
// Why: at small batches a step streams the weights at the memory bandwidth and everything else is overhead:
// ~18 Python-level torch calls per layer (views, splits, the KV write, the kernels' dispatch) during which the
// memory bus idles. From C++ the same work costs a few microseconds per layer (benchmarks/README.md).
//
// With gated_mlp, gate_up's copy is pack_gated_panels' and the SiLU runs in its epilogue (panel_linear_silu, as
// CpuOps.mlp). No tensor parallelism; the KV cache in the model's dtype.
#include <ATen/ATen.h>

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
        TORCH_CHECK(t.has_value(), "paged_decoder_layers: layer ", layer, " lacks weight #", static_cast<int64_t>(s));
        return *t;
    }
    int64_t out_features(Linear l) const { return sizes[(layer * kLinears + l) * 2]; }
    at::Tensor linear(const at::Tensor& x, Linear l, Slot plain) const {  // plain, packed, bias are consecutive
        return rtp_llm::linear(x, opt(plain), opt(static_cast<Slot>(plain + 1)), opt(static_cast<Slot>(plain + 2)),
                               out_features(l), sizes[(layer * kLinears + l) * 2 + 1]);
    }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> paged_decoder_layers(
    const at::Tensor& x_in, const c10::List<std::optional<at::Tensor>>& weights, at::IntArrayRef sizes,
    const at::Tensor& kv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
    const at::Tensor& block_table, const at::Tensor& kv_lens, int64_t num_heads, int64_t num_kv_heads, double eps,
    double scale, bool gated_mlp) {
    const int64_t layers = kv.size(0), tokens = x_in.size(0);
    TORCH_CHECK(x_in.dim() == 2 && x_in.is_contiguous(), "paged_decoder_layers: x must be contiguous [tokens, hidden]");
    TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kSlots, "paged_decoder_layers: ", kSlots,
                " weight slots per layer expected for ", layers, " layers, got ", weights.size());
    TORCH_CHECK(static_cast<int64_t>(sizes.size()) == layers * kLinears * 2, "paged_decoder_layers: ",
                kLinears * 2, " sizes per layer expected for ", layers, " layers, got ", sizes.size());
    TORCH_CHECK(kv.dim() == 6 && kv.size(1) == 2 && kv.size(4) == num_kv_heads && kv.is_contiguous() &&
                    kv.scalar_type() == x_in.scalar_type(),
                "paged_decoder_layers: kv must be the contiguous [layers, 2, blocks, block_size, kv_heads, head_dim] "
                "buffer in x's dtype");
    TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == tokens,
                "paged_decoder_layers: slots must be int64 [tokens]");
    const int64_t head_dim = kv.size(5), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    const int64_t capacity = kv.size(2) * kv.size(3);
    const int64_t* sp = slots.data_ptr<int64_t>();
    for (int64_t t = 0; t < tokens; ++t)
        TORCH_CHECK(sp[t] >= 0 && sp[t] < capacity, "paged_decoder_layers: slot ", sp[t], " outside [0, ", capacity,
                    ")");

    at::Tensor x = x_in, residual, h;
    for (int64_t i = 0; i < layers; ++i) {
        const LayerWeights lw{weights, sizes, i};
        if (i == 0) {
            residual = x;
            h = rms_norm(x, lw.req(kInputNorm), eps);
        } else {
            std::tie(h, residual) = add_rms_norm(x, residual, lw.req(kInputNorm), eps);
        }
        // Each GEMM's threads request the first panels of the one after it (PanelsAfter).
        const auto gate_up_p = lw.opt(kGateUpP);
        const auto next_qkv_p = i + 1 < layers ? LayerWeights{weights, sizes, i + 1}.opt(kQkvP) : std::nullopt;
        at::Tensor qkv;
        {
            PanelsAfter then(lw.opt(kOP));
            qkv = lw.linear(h, kQkv, kQkvW);
        }
        auto q = qkv.narrow(1, 0, q_size).reshape({tokens, num_heads, head_dim});
        auto k = qkv.narrow(1, q_size, kv_size).reshape({tokens, num_kv_heads, head_dim});
        auto v = qkv.narrow(1, q_size + kv_size, kv_size).contiguous();
        if (auto qn = lw.opt(kQNorm)) {
            q = rms_norm(q.contiguous(), *qn, eps);
            k = rms_norm(k.contiguous(), lw.req(kKNorm), eps);
        }
        std::tie(q, k) = rotary(q, k, cos, sin);
        auto layer_kv = kv.select(0, i);
        auto k_cache = layer_kv.select(0, 0), v_cache = layer_kv.select(0, 1);
        write_kv_rows(k, k_cache, sp);
        write_kv_rows(v, v_cache, sp);
        auto o = paged_attention(q, k_cache, v_cache, block_table, kv_lens, scale).reshape({tokens, q_size});
        {
            PanelsAfter then(gate_up_p);
            x = lw.linear(o, kO, kOW);
        }
        std::tie(h, residual) = add_rms_norm(x, residual, lw.req(kPostNorm), eps);
        at::Tensor act;
        {
            PanelsAfter then(lw.opt(kDownP));
            act = gated_mlp ? panel_linear_silu(h, lw.req(kGateUpP), lw.opt(kGateUpB), lw.out_features(kGateUp) / 2)
                            : silu_and_mul(lw.linear(h, kGateUp, kGateUpW));
        }
        PanelsAfter then(next_qkv_p);
        x = lw.linear(act, kDown, kDownW);
    }
    return {x, residual};
}

}  // namespace rtp_llm
