// The horizontal sums of the AVX-512 kernels: one vector's lanes in a fixed tree (reduce1), and 8 or 16 vectors
// at once in the same tree (reduce8v, reduce16v), so a result does not depend on how many were summed together.
// No torch: vec/avx512_reduce_test.cc checks them alone. Include only under
// `#if defined(__x86_64__) && defined(__GNUC__)`.
#pragma once

#include <immintrin.h>

// The instruction set of the AVX-512 kernels, carried per function (see vec/avx512.h).
#define RTP_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))

namespace rtp_llm {
namespace avx512 {

// The lanes of a summed in the order every output uses: lane i + lane i+8, then + i+4, + i+2, + i+1
// (the order of _mm512_reduce_add_ps, spelled out).
RTP_AVX512 inline float reduce1(__m512 a) {
    const __m256 s = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

// lane i = reduce1(a[i]) for 8 vectors, the same tree for each, with 4 shuffle stages shared by all 8 (about
// a third of the instructions of 8 separate reductions), the sums in one vector (no scalar extraction).
RTP_AVX512 inline __m256 reduce8v(const __m512 a[8]) {
    __m512 t[4], u[2];
    for (int p = 0; p < 4; ++p)  // [a_2p lanes 0-7 + 8-15, a_2p+1 lanes 0-7 + 8-15]
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xee));
    for (int p = 0; p < 2; ++p)  // 128-bit block j: vector 4p + j, lanes i + i+4
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0xdd));
    // block j: [vector j: i + i+2 (2 lanes), vector 4 + j: i + i+2 (2 lanes)]
    const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x44), _mm512_shuffle_ps(u[0], u[1], 0xee));
    const __m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));  // + lane i+1: vector j in lane 4j, 4 + j in 4j+2
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, w));
}

RTP_AVX512 inline void reduce8(const __m512 a[8], float out[8]) { _mm256_storeu_ps(out, reduce8v(a)); }

// lane i = reduce1(a[i]) for 16 vectors: reduce8v's stages over twice the vectors, one more shared stage
// instead of the in-register pair add (a bit under 3 instructions per sum).
RTP_AVX512 inline __m512 reduce16v(const __m512 a[16]) {
    __m512 t[8], u[4], v[2];
    for (int p = 0; p < 8; ++p)
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xee));
    for (int p = 0; p < 4; ++p)  // u[p] block j: vector 4p + j, lanes i + i+4
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0xdd));
    for (int p = 0; p < 2; ++p)  // v[p] block j: [vector 8p + j: i + i+2, vector 8p + 4 + j: i + i+2]
        v[p] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0xee));
    // block j: [vector j, 4 + j, 8 + j, 12 + j], each lane i + i+1 of its pair
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xdd));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, w);
}

}  // namespace avx512
}  // namespace rtp_llm
