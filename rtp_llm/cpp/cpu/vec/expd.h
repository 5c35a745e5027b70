// exp(x) in float64 to ~1 ulp for the kernels that sum probabilities in float64 (top_k_top_p.cc): x = n ln2 + r
// with |r| <= ln2/2 (ln2 split in two for an exact reduction), a degree-13 Taylor polynomial for e^r (truncation
// < 1e-17), 2^n through the exponent bits. x below kLow gives 0 (std::exp would give a subnormal); NaN stays NaN.
// expd1 is exp4d's lane, bit for bit (the same FMAs in the same order), so a kernel may mix the two.
#pragma once

#include <cstdint>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace rtp_llm {
namespace vec {
namespace expd_poly {
constexpr double kLow = -708.0, kHigh = 709.0, kLog2e = 1.4426950408889634074;
constexpr double kLn2Hi = 0.693147180369123816490, kLn2Lo = 1.90821492927058770002e-10;
constexpr double kInvFact[14] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
                                 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600,
                                 1.0 / 6227020800.0};
}  // namespace expd_poly

inline double expd1(double x) {
    using namespace expd_poly;
    if (x < kLow) return 0.0;
    if (x != x) return x;
    x = x > kHigh ? kHigh : x;
    const double n = __builtin_nearbyint(x * kLog2e);
    double r = __builtin_fma(-n, kLn2Hi, x);
    r = __builtin_fma(-n, kLn2Lo, r);
    double y = kInvFact[13];
    for (int k = 12; k >= 0; --k) y = __builtin_fma(y, r, kInvFact[k]);
    const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(n) + 1023) << 52;
    double scale;
    __builtin_memcpy(&scale, &bits, sizeof(scale));
    return y * scale;
}

#ifdef __AVX2__
// exp(x), 4 float64 lanes; each lane equals expd1.
inline __m256d exp4d(__m256d x) {
    using namespace expd_poly;
    const __m256d under = _mm256_cmp_pd(x, _mm256_set1_pd(kLow), _CMP_LT_OQ);
    x = _mm256_min_pd(_mm256_set1_pd(kHigh), x);  // min(kHigh, NaN) is NaN
    const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(kLog2e)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kLn2Hi), x);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kLn2Lo), r);
    __m256d y = _mm256_set1_pd(kInvFact[13]);
    for (int k = 12; k >= 0; --k) y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(kInvFact[k]));
    // lanes outside [kLow, kHigh] are masked (under) or NaN already: the clamp only keeps the exponent in range
    const __m256d nc = _mm256_max_pd(_mm256_set1_pd(-1022.0), _mm256_min_pd(_mm256_set1_pd(1023.0), n));
    const __m256i e = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(nc)), _mm256_set1_epi64x(1023));
    const __m256d scaled = _mm256_mul_pd(y, _mm256_castsi256_pd(_mm256_slli_epi64(e, 52)));
    return _mm256_andnot_pd(under, scaled);
}
#endif  // __AVX2__

}  // namespace vec
}  // namespace rtp_llm
