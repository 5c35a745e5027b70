// The AVX-512 GEMV kernel (gemv_avx512.cc), used by skinny_linear when the CPU has AVX-512.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace rtp_llm {

constexpr int64_t kGemvMaxRows = 16;

// Whether this CPU runs the AVX-512 kernel (decided once; RTP_LLM_CPU_NO_AVX512=1 turns it off).
bool gemv_avx512_enabled();

// out[m, n] = x[m, k] (float32) @ w[n, k]^T (+ bias[n]), rounded once to out's type; 1 <= m <= kGemvMaxRows.
void gemv_avx512(const float* w, const float* x, const float* bias, float* out, int64_t m, int64_t k, int64_t n);
void gemv_avx512(const c10::BFloat16* w, const float* x, const float* bias, c10::BFloat16* out, int64_t m,
                 int64_t k, int64_t n);

}  // namespace rtp_llm
