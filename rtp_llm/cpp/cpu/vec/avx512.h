// AVX-512 building blocks shared by the kernels chosen at run time on CPUs that have it (gemv_avx512.cc,
// panel_linear.cc, paged_attention_avx512.cc). The files are compiled for any x86-64; these functions carry
// the instruction set in a target attribute, so nothing here runs unless the caller checked the CPU
// (cpu_avx512()). Include only under `#if defined(__x86_64__) && defined(__GNUC__)`.
#pragma once

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include "rtp_llm/cpp/cpu/vec/avx2.h"

// GCC 12's AVX-512 intrinsics start their shuffles from _mm512_undefined_ps(), which -Wuninitialized flags
// once they are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "rtp_llm/cpp/cpu/vec/avx512_sums.h"  // RTP_AVX512, reduce1 / reduce8 / reduce8v / reduce16v

// RTP_AVX512 plus the bf16 dot products and conversions (vdpbf16ps, vcvtneps2bf16): only for code that checked
// cpu_avx512_bf16(). The compiler emits these instructions only for their intrinsics, so a template
// compiled with this target whose fp32 instantiation uses none of them is safe on any AVX-512 CPU.
#define RTP_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))

namespace rtp_llm {
namespace avx512 {

RTP_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

// bf16 -> fp32 is a 16-bit shift.
RTP_AVX512 inline __m512 load16(const c10::BFloat16* p) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// The first lanes of `mask`, the others zero (the tail of a row; nothing past it is read).
RTP_AVX512 inline __m512 load16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }

RTP_AVX512 inline __m512 load16(const c10::BFloat16* p, __mmask16 mask) {
    const __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Each lane rounded to bf16, to nearest even on the bits (denormals kept, as c10::BFloat16 rounds a finite
// float): the bf16 value in the high half of each lane, the low half zero.
RTP_AVX512 inline __m512i bf16_rne_bits(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))),
                            _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
}

// exp(x), 16 lanes (vec::expf_poly in cpu_vec.h: the same method and constants as vec::exp8).
RTP_AVX512 inline __m512 exp16(__m512 x) {
    using namespace vec::expf_poly;
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kLow)), _mm512_set1_ps(kHigh));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
    __m512 y = _mm512_set1_ps(kP[0]);
    for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP[i]));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

}  // namespace avx512
}  // namespace rtp_llm
