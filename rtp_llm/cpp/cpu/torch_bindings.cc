// Every CPU kernel as a torch operator, torch.ops.rtp_llm.<name>, in one place (as vLLM's csrc/cpu/
// torch_bindings.cpp). rtp_llm/_ops.so is loaded with torch.ops.load_library (rtp_llm/_native.py).
#include <torch/library.h>

#include <optional>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/memory/huge_pages.h"

namespace rtp_llm {
namespace {

at::Tensor huge_page_zeros_op(c10::IntArrayRef sizes, std::optional<at::ScalarType> dtype) {
    return huge_page_zeros(sizes, dtype.value_or(at::kFloat));
}

}  // namespace

TORCH_LIBRARY(rtp_llm, m) {
    // What this process runs (cpu_features.h).
    m.def("cpu_isa() -> str", &cpu_isa);
    m.def("cpu_avx512_bf16() -> bool", &cpu_avx512_bf16);
    m.def("cpu_amx_bf16() -> bool", &cpu_amx_bf16);
    m.def("huge_page_zeros(int[] sizes, ScalarType? dtype=None) -> Tensor", &huge_page_zeros_op);

    m.def("linear(Tensor x, Tensor? plain, Tensor? packed, Tensor? bias, int n, int gemv_max_rows) -> Tensor");
    m.def("gemv(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
    m.def("quant_pack(Tensor[] parts) -> Tensor");
    m.def("quant_linear(Tensor x, Tensor w, Tensor? bias, int n) -> Tensor");
    m.def("quant_linear_silu(Tensor x, Tensor w, Tensor? bias, int inter) -> Tensor");
    m.def("linear_silu(Tensor x, Tensor packed, Tensor? bias, int inter) -> Tensor");
    m.def("quant_packed_rows(Tensor w, Tensor rows, int n) -> Tensor");
    m.def("quant_dequantize(Tensor w) -> Tensor");
    m.def("pack_panels(Tensor w) -> Tensor");
    m.def("panel_linear(Tensor x, Tensor panels, Tensor? bias, int n) -> Tensor");
    m.def("pack_gated_panels(Tensor w) -> Tensor");
    m.def("panel_linear_silu(Tensor x, Tensor panels, Tensor? bias, int inter) -> Tensor");
    m.def("greedy_bounds(Tensor w) -> Tensor");
    m.def("pack_greedy_screen(Tensor w) -> (Tensor, Tensor)");
    m.def("quant_greedy_head(Tensor h, Tensor packed, Tensor bounds, int n) -> Tensor");
    m.def("quant_greedy_bounds(Tensor packed, int n) -> Tensor");
    m.def("greedy_head(Tensor h, Tensor screen, Tensor bounds, Tensor weight) -> Tensor");
    m.def("argmax_rows(Tensor logits) -> Tensor");

    m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
    m.def("rotary(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
    m.def("silu_and_mul(Tensor gate_up) -> Tensor");
    m.def("silu_and_mul_gated(Tensor gate_up, int inter) -> Tensor");

    m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor kv_lens, "
          "float scale) -> Tensor");
    m.def("prefill_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor q_starts, "
          "Tensor kv_lens, float scale) -> Tensor");
    m.def("write_kv(Tensor k, Tensor v, Tensor(a!) layer_kv, Tensor slots) -> ()");

    m.def("apply_top_k_top_p(Tensor logits, Tensor? k, Tensor? p) -> Tensor");
    m.def("exponential_race(Tensor probs, Tensor seeds, Tensor steps) -> Tensor");

    m.def("decoder_layer_slots() -> str[]", &decoder_layer_slots);
    m.def("decoder_layer_linears() -> str[]", &decoder_layer_linears);
    m.def("decoder_layers(Tensor x, Tensor?[] weights, int[] sizes, Tensor kv, Tensor cos, Tensor sin, "
          "Tensor slots, Tensor block_table, Tensor kv_lens, Tensor? q_starts, int num_heads, int num_kv_heads, "
          "float eps, float scale, bool gated_mlp, int piece_rows, Tensor[] lora_rows, Tensor?[] lora_weights) "
          "-> (Tensor, Tensor)");
    m.def("lora_add_(Tensor(a!) y, Tensor x, Tensor?[] rows, Tensor[] a, Tensor[] b, Tensor[] tiles) -> ()");
}

TORCH_LIBRARY_IMPL(rtp_llm, CPU, m) {
    m.impl("linear", &linear);
    m.impl("gemv", &gemv);
    m.impl("quant_pack", &quant_pack);
    m.impl("quant_linear", &quant_linear);
    m.impl("quant_linear_silu", &quant_linear_silu);
    m.impl("linear_silu", &linear_silu);
    m.impl("quant_packed_rows", &quant_packed_rows);
    m.impl("quant_dequantize", &quant_dequantize);
    m.impl("pack_panels", &pack_panels);
    m.impl("panel_linear", &panel_linear);
    m.impl("pack_gated_panels", &pack_gated_panels);
    m.impl("panel_linear_silu", &panel_linear_silu);
    m.impl("greedy_bounds", &greedy_bounds);
    m.impl("pack_greedy_screen", &pack_greedy_screen);
    m.impl("quant_greedy_head", &quant_greedy_head);
    m.impl("quant_greedy_bounds", &quant_greedy_bounds);
    m.impl("greedy_head", &greedy_head);
    m.impl("argmax_rows", &argmax_rows);
    m.impl("rms_norm", &rms_norm);
    m.impl("add_rms_norm", &add_rms_norm);
    m.impl("rotary", &rotary);
    m.impl("silu_and_mul", &silu_and_mul);
    m.impl("silu_and_mul_gated", &silu_and_mul_gated);
    m.impl("paged_attention", &paged_attention);
    m.impl("prefill_attention", &prefill_attention);
    m.impl("write_kv", &write_kv);
    m.impl("apply_top_k_top_p", &apply_top_k_top_p);
    m.impl("exponential_race", &exponential_race);
    m.impl("decoder_layers", &decoder_layers);
    m.impl("lora_add_", &lora_add_);
}

// oneDNN's blocked weight copies are MkldnnCPU tensors, which route a whole call that takes one to that key.
TORCH_LIBRARY_IMPL(rtp_llm, MkldnnCPU, m) {
    m.impl("linear", &linear);
    m.impl("decoder_layers", &decoder_layers);
}

}  // namespace rtp_llm
