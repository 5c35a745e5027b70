// The fp32 linear layer on weights packed into 48-column panels (panel_linear.cc), for CPUs with AVX-512.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace rtp_llm {

constexpr int64_t kPanelCols = 48;

// Whether this CPU runs the panel kernel (AVX-512, decided once; RTP_LLM_CPU_NO_AVX512=1 turns it off).
bool panel_linear_enabled();

// w [N, K] float32 -> panels [ceil(N / 48), K, 48]: panels[p, k, c] = w[48p + c, k], zero past row N.
at::Tensor pack_panels(const at::Tensor& w);

// x [M, K] @ w^T (+ bias) -> [M, n], w given as pack_panels(w) and its row count n.
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                        int64_t n);

// The kernel on raw pointers (out [m, n] row-major; bias may be null).
void panel_linear_avx512(const float* panels, const float* x, const float* bias, float* out, int64_t m, int64_t k,
                         int64_t n);

}  // namespace rtp_llm
