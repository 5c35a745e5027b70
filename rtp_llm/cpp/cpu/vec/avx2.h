// Vector building blocks shared by the CPU kernels: a portable dot product, and with AVX2 8-lane loads of
// float32 / bfloat16 / float16 into float32 and stores back (round-to-nearest-even), horizontal sums and a
// vectorised exp. Compiled with -mavx2 -mfma -mf16c (rtp_llm/cpp/cpu/BUILD); kernels keep a scalar path
// for machines or shapes the AVX2 code does not cover.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace rtp_llm {
namespace vec {

// float -> T. For BFloat16 the bits c10::BFloat16(float) gives (round to nearest even, NaN -> 0x7FC0) without its
// branch, so that element-wise loops over it vectorise (c10's conversion keeps them scalar).
template <typename T>
inline T to(float x) {
    return static_cast<T>(x);
}

template <>
inline c10::BFloat16 to<c10::BFloat16>(float x) {
    uint32_t u;
    __builtin_memcpy(&u, &x, sizeof(u));
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return c10::BFloat16(static_cast<uint16_t>(x != x ? 0x7FC0u : rounded), c10::BFloat16::from_bits());
}

// x rounded to T's precision and back: the identity for float, bf16 round-to-nearest-even for BFloat16.
// Kernels that must round where the reference's aten ops round (bf16 intermediates) call this.
template <typename T>
inline float round_as(float x) {
    return static_cast<float>(to<T>(x));
}

// sum_i a[i] * b[i] in float32 (the compiler vectorises the reduction).
template <typename T>
inline float dot(const T* a, const float* b, int64_t n) {
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += static_cast<float>(a[i]) * b[i];
    return acc;
}

// exp(x) to ~1 ulp, the method of exp8 and avx512::exp16: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two
// for an exact reduction), a degree-6 polynomial for e^r (the Cephes expf coefficients), 2^n through the
// exponent bits. Inputs are clamped to [kLow, kHigh], where the float32 result is normal; exp(0) is exactly 1.
namespace expf_poly {
constexpr float kLow = -87.33654f, kHigh = 88.37626f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace expf_poly

#ifdef __AVX2__

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// bf16 -> fp32 is a 16-bit shift; spelled out because compilers do not vectorise c10::BFloat16's conversion.
inline __m256 load8(const c10::BFloat16* p) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline __m256 load8(const c10::Half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }

// fp32 -> bf16 with round-to-nearest-even, as c10::BFloat16 does (NaN payloads aside).
inline void store8(c10::BFloat16* p, __m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

inline void store8(c10::Half* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// x rounded to T's precision and back (the identity for float).
inline __m256 round_to(__m256 x, const float*) { return x; }
inline __m256 round_to(__m256 x, const c10::BFloat16*) {
    alignas(32) c10::BFloat16 tmp[8];
    store8(tmp, x);
    return load8(tmp);
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Lane i of the result = the horizontal sum of a[i]: eight dot products finished with 8 adds and shuffles
// instead of eight separate reductions.
inline __m256 hsum8(const __m256 a[8]) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// exp(x), 8 lanes (expf_poly above).
inline __m256 exp8(__m256 x) {
    using namespace expf_poly;
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kLow)), _mm256_set1_ps(kHigh));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
    __m256 y = _mm256_set1_ps(kP[0]);
    for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP[i]));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

#endif  // __AVX2__

}  // namespace vec
}  // namespace rtp_llm
