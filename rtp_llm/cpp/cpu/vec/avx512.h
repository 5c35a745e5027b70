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

#define RTP_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
// Plus the bf16 dot products and conversions (vdpbf16ps, vcvtneps2bf16): only for code that checked
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

// The lanes of a summed in the order every output uses: lane i + lane i+8, then + i+4, + i+2, + i+1
// (the order of _mm512_reduce_add_ps, spelled out).
RTP_AVX512 inline float reduce1(__m512 a) {
    const __m256 s = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

// out[i] = reduce1(a[i]) for 8 vectors, the same tree for each, with 4 shuffle stages shared by all 8 (about
// a third of the instructions of 8 separate reductions).
RTP_AVX512 inline void reduce8(const __m512 a[8], float out[8]) {
    __m512 t[4], u[2];
    for (int p = 0; p < 4; ++p)  // [a_2p lanes 0-7 + 8-15, a_2p+1 lanes 0-7 + 8-15]
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xee));
    for (int p = 0; p < 2; ++p)  // 128-bit block j: vector 4p + j, lanes i + i+4
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0xdd));
    // block j: [vector j: i + i+2 (2 lanes), vector 4 + j: i + i+2 (2 lanes)]
    const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x44), _mm512_shuffle_ps(u[0], u[1], 0xee));
    alignas(64) float w[16];
    _mm512_store_ps(w, _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1)));  // + lane i+1
    for (int j = 0; j < 4; ++j) out[j] = w[4 * j], out[4 + j] = w[4 * j + 2];
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
