// Every decoder layer of a step whose rows all go through the paged attention kernel (decodes, and short
// chunks after a cached prefix: rtp_llm/layers/attention/cpu.py), in one call: the kernels the Python layer
// (rtp_llm/models/decoder.py with CpuOps) would call one by one, in the same order on the same tensors, with
// the same choice of linear kernel per row count, so the result is bit-for-bit the same.
//
// Why: at batch 1-16 the step streams the weights at the memory bandwidth (~16 ms of
// SmolLM2's 538 MB fp32 here) and everything else is overhead: ~18 Python-level torch calls per layer
// (views, splits, index_put for the KV write, the kernels' dispatch), ~3 ms per step over 30 layers, with
// the memory bus idle meanwhile; larger decode batches (oneDNN's packed GEMM) pay the same. From C++ the
// same work costs a few microseconds per layer.
//
// Linear layers: the GEMV kernel (plain weight) up to gemv_max_rows rows, else the packed copy: the panel
// kernel (panel_linear.cc) on panels, oneDNN's packed GEMM on its blocked copy (mkldnn::_linear_pointwise,
// called through the dispatcher as CpuOps calls it), else at::linear on the plain weight; with gated_mlp,
// gate_up on pack_gated_panels' panels and the SiLU in their epilogue (panel_linear_silu, as CpuOps.mlp). No
// tensor parallelism; the KV cache in the model's dtype.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include "rtp_llm/cpp/ops/cpu_kernels.h"
#include "rtp_llm/cpp/ops/panel_linear.h"

#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

namespace rtp_llm {
namespace {

// Per layer, `layer_weights` holds these, in this order (None where the model has no such tensor; the plain
// weights may be empty when only the blocked copies (*P) were kept).
enum Slot : int64_t {
    kInputNorm, kQkvW, kQkvB, kQNorm, kKNorm, kOW, kOB, kPostNorm, kGateUpW, kGateUpB, kDownW, kDownB,
    kQkvP, kOP, kGateUpP, kDownP, kSlots
};

std::optional<at::Tensor> opt(const c10::List<std::optional<at::Tensor>>& w, int64_t layer, Slot s) {
    std::optional<at::Tensor> t = w.get(layer * kSlots + s);
    return t.has_value() && t->defined() ? t : std::nullopt;
}

at::Tensor req(const c10::List<std::optional<at::Tensor>>& w, int64_t layer, Slot s) {
    auto t = opt(w, layer, s);
    TORCH_CHECK(t.has_value(), "decode_layers: layer ", layer, " lacks required weight #", static_cast<int64_t>(s));
    return *t;
}

// x @ W^T (+ b) with oneDNN's blocked weight copy: the op CpuOps._packed_linear calls.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    torch::jit::Stack stack{x, packed, bias, std::string("none"), c10::List<std::optional<at::Scalar>>(),
                            std::optional<std::string>(std::string())};
    op.callBoxed(&stack);
    return stack[0].toTensor();
}

// The linear layer as CpuOps.linear decides it: GEMV on few rows, else the packed copy (panels, 3-D, or
// oneDNN's blocked layout), else at::linear. n: the layer's output features (panels are padded to 48).
at::Tensor linear(const at::Tensor& x, const c10::List<std::optional<at::Tensor>>& w, int64_t layer, Slot plain,
                  Slot packed, Slot bias, int64_t gemv_max_rows, int64_t n) {
    const auto p = opt(w, layer, plain);
    const auto b = opt(w, layer, bias);
    if (p && p->numel() > 0 && x.size(0) <= gemv_max_rows) return skinny_linear(x, *p, b);
    if (const auto copy = opt(w, layer, packed)) {
        if (!copy->is_mkldnn() && copy->dim() == 3) return panel_linear(x, *copy, b, n);
        return packed_linear(x, *copy, b);
    }
    TORCH_CHECK(p && p->numel() > 0, "decode_layers: layer ", layer, " has neither weight #",
                static_cast<int64_t>(plain), " nor its blocked copy");
    return at::linear(x, *p, b);
}

std::tuple<at::Tensor, at::Tensor> decode_layers(const at::Tensor& x_in,
                                                 const c10::List<std::optional<at::Tensor>>& layer_weights,
                                                 const at::Tensor& kv, const at::Tensor& cos, const at::Tensor& sin,
                                                 const at::Tensor& slots, const at::Tensor& block_table,
                                                 const at::Tensor& kv_lens, int64_t num_heads, int64_t num_kv_heads,
                                                 double eps, double scale, int64_t gemv_max_rows, bool gated_mlp) {
    const int64_t layers = kv.size(0), tokens = x_in.size(0);
    TORCH_CHECK(x_in.dim() == 2 && x_in.is_contiguous(), "decode_layers: x must be contiguous [tokens, hidden]");
    TORCH_CHECK(static_cast<int64_t>(layer_weights.size()) == layers * kSlots, "decode_layers: ", kSlots,
                " weight slots per layer expected for ", layers, " layers, got ", layer_weights.size());
    TORCH_CHECK(kv.dim() == 6 && kv.size(1) == 2 && kv.size(4) == num_kv_heads && kv.is_contiguous() &&
                    kv.scalar_type() == x_in.scalar_type(),
                "decode_layers: kv must be the contiguous [layers, 2, blocks, block_size, kv_heads, head_dim] "
                "buffer in x's dtype");
    TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == tokens,
                "decode_layers: slots must be int64 [tokens]");
    const int64_t head_dim = kv.size(5), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    const int64_t hidden = x_in.size(1);
    const int64_t capacity = kv.size(2) * kv.size(3);
    const int64_t* sp = slots.data_ptr<int64_t>();
    for (int64_t t = 0; t < tokens; ++t)
        TORCH_CHECK(sp[t] >= 0 && sp[t] < capacity, "decode_layers: slot ", sp[t], " outside [0, ", capacity, ")");

    at::Tensor x = x_in, residual, h;
    for (int64_t i = 0; i < layers; ++i) {
        if (i == 0) {
            residual = x;
            h = rms_norm(x, req(layer_weights, i, kInputNorm), eps);
        } else {
            std::tie(h, residual) = add_rms_norm(x, residual, req(layer_weights, i, kInputNorm), eps);
        }
        auto qkv = linear(h, layer_weights, i, kQkvW, kQkvP, kQkvB, gemv_max_rows, q_size + 2 * kv_size);
        auto q = qkv.narrow(1, 0, q_size).reshape({tokens, num_heads, head_dim});
        auto k = qkv.narrow(1, q_size, kv_size).reshape({tokens, num_kv_heads, head_dim});
        auto v = qkv.narrow(1, q_size + kv_size, kv_size).contiguous();
        if (auto qn = opt(layer_weights, i, kQNorm)) {
            q = rms_norm(q.contiguous(), *qn, eps);
            k = rms_norm(k.contiguous(), req(layer_weights, i, kKNorm), eps);
        }
        std::tie(q, k) = rotary(q, k, cos, sin);
        auto layer_kv = kv.select(0, i);
        auto k_cache = layer_kv.select(0, 0), v_cache = layer_kv.select(0, 1);
        write_kv_rows(k, k_cache, sp);
        write_kv_rows(v, v_cache, sp);
        auto o = paged_decode_attention(q, k_cache, v_cache, block_table, kv_lens, scale).reshape({tokens, q_size});
        x = linear(o, layer_weights, i, kOW, kOP, kOB, gemv_max_rows, hidden);
        std::tie(h, residual) = add_rms_norm(x, residual, req(layer_weights, i, kPostNorm), eps);
        // gate_up's output features: twice the down projection's input features (what `act` has); bf16 pair
        // panels hold those in pairs (CpuOps packs only even widths so)
        const auto down_p = opt(layer_weights, i, kDownP);
        const int64_t inter = down_p ? (down_p->scalar_type() == at::kInt ? 2 : 1) * down_p->size(1)
                                     : req(layer_weights, i, kDownW).size(1);
        // gated_mlp: gate_up's panels are pack_gated_panels' (CpuOps.prepare), the SiLU in their epilogue
        auto act = gated_mlp ? panel_linear_silu(h, req(layer_weights, i, kGateUpP), opt(layer_weights, i, kGateUpB),
                                                 inter)
                             : silu_and_mul(linear(h, layer_weights, i, kGateUpW, kGateUpP, kGateUpB, gemv_max_rows,
                                                   2 * inter));
        x = linear(act, layer_weights, i, kDownW, kDownP, kDownB, gemv_max_rows, hidden);
    }
    return {x, residual};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rtp_llm, m) {
    m.def("decode_layers(Tensor x, Tensor?[] layer_weights, Tensor kv, Tensor cos, Tensor sin, Tensor slots, "
          "Tensor block_table, Tensor kv_lens, int num_heads, int num_kv_heads, float eps, float scale, "
          "int gemv_max_rows, bool gated_mlp=False) "
          "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(rtp_llm, CPU, m) { m.impl("decode_layers", &decode_layers); }

// oneDNN's blocked weight copies are MkldnnCPU tensors, which route the whole call to that dispatch key.
TORCH_LIBRARY_IMPL(rtp_llm, MkldnnCPU, m) { m.impl("decode_layers", &decode_layers); }

}  // namespace rtp_llm
