// The fp32 linear layer on weights packed into 48-column panels (panel_linear.cc), for CPUs with AVX-512.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace rtp_llm {

constexpr int64_t kPanelCols = 48;

// Whether this CPU runs the panel kernel (AVX-512, decided once; RTP_LLM_CPU_NO_AVX512=1 turns it off), and
// its bfloat16 form (also avx512_bf16).
bool panel_linear_enabled();
bool panel_linear_bf16_enabled();
bool cpu_has_bf16_dot();

// w [N, K] float32 -> panels [ceil(N / 48), K, 48]: panels[p, k, c] = w[48p + c, k], zero past row N.
// w bfloat16 -> pack_pair_panels(w).
at::Tensor pack_panels(const at::Tensor& w);

// w [N, K] (bfloat16, or float32 rounded to nearest even) -> [ceil(N / 48), ceil(K / 2), 48] int32: at [p, i, c]
// the bf16 pair (w[48p + c, 2i] low half, w[48p + c, 2i + 1] high half), zero past row N and column K.
at::Tensor pack_pair_panels(const at::Tensor& w);

// x [M, K] @ w^T (+ bias) -> [M, n], w given as pack_panels(w) and its row count n.
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                        int64_t n);

// The SiLU-gated MLP's first half in one pass. w [2 I, K] = [gate; up] (float32 or bfloat16) -> panels of 24
// gate and the same 24 up rows each ([ceil(I / 24), K (bf16: pairs), 48]); panel_linear_silu(x, panels,
// bias [2 I] or none, I) = silu(gate) * up [M, I]: bit for bit silu_and_mul(panel_linear(x, pack_panels(w)))
// without the [M, 2 I] intermediate.
at::Tensor pack_gated_panels(const at::Tensor& w);
at::Tensor panel_linear_silu(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                             int64_t inter);

// The kernels on raw pointers (out [m, n] row-major; bias may be null). bf16: x as [m, pairs] bf16 pairs;
// products exact in fp32, summed in fp32 (each pair's high then low product), the output rounded to bf16.
void panel_linear_avx512(const float* panels, const float* x, const float* bias, float* out, int64_t m, int64_t k,
                         int64_t n);
void panel_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                       int64_t m, int64_t pairs, int64_t n);
void panel_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, float* out, int64_t m,
                       int64_t pairs, int64_t n);  // the fp32 sums, unrounded
void panel_linear_silu_fp32(const float* panels, const float* x, const float* bias, float* out, int64_t m,
                            int64_t k, int64_t inter);  // bias in the panels' order
void panel_linear_silu_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                            int64_t m, int64_t pairs, int64_t inter);

}  // namespace rtp_llm
