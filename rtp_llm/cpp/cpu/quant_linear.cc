// x [M, K] (float32; bfloat16 widened to it) @ W^T (+ bias) for a weight kept in its GGUF blocks (quant_blocks.h): the dequantized model's
// math without its fp32 copy. Each weight is decoded to exactly gguf's float32 value and multiplied with the
// float32 activation; the activations are not quantized (unlike llama.cpp's kernels).
//
// Summation order, per output, for every row count, kernel and instruction set: sixteen lanes, lane l summing
// x[16c + l] * w[16c + l] over the 16-wide chunks c in order with fused multiply-adds, then the lanes in one fixed
// tree (l + l+8, + l+4, + l+2, + l+1), then the bias. So a row's result does not depend on how many rows share its
// step, and a CPU without AVX-512 gets the same bits as one with it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/cpu_features.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/quant_blocks.h"

namespace rtp_llm {
namespace {

using quant::Format;

// The sixteen lanes as two 8-wide halves (lanes 0-7, 8-15), reduced in the tree above: l + l+8, + l+4, then
// (0 + 2) + (1 + 3).
inline float reduce16(__m256 lo, __m256 hi) {
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// 8 bytes -> 8 floats.
inline __m256 u8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

// 32 quant bytes (element order) -> w[0..31] = op(float(q)).
template <typename Op>
inline void store_q32(__m256i q, float* w, Op op) {
    const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int h = 0; h < 2; ++h) {
        _mm256_storeu_ps(w + 16 * h, op(u8_to_ps(halves[h])));
        _mm256_storeu_ps(w + 16 * h + 8, op(u8_to_ps(_mm_srli_si128(halves[h], 8))));
    }
}

// Bit j of qh (j = 0..31) as 0x10 in byte j: Q5_0 / Q5_1's fifth bit.
inline __m256i fifth_bits(uint32_t qh) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(qh)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3,
                         3));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// decode_block's values, 8 at a time: the same product and sum per weight, each rounded as the scalar code rounds
// it.
inline void decode_block_avx2(Format f, const uint8_t* b, float* w) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m256 d = _mm256_set1_ps(quant::half_at(b));
    switch (f) {
        case Format::kQ8_0:
            for (int j = 0; j < 32; j += 8) {
                const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + j));
                _mm256_storeu_ps(w + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
            }
            return;
        case Format::kQ4_0:
        case Format::kQ4_1:
        case Format::kQ5_0:
        case Format::kQ5_1: {
            const bool with_min = f == Format::kQ4_1 || f == Format::kQ5_1;
            const bool five = f == Format::kQ5_0 || f == Format::kQ5_1;
            const uint8_t* qs = b + 2 + (with_min ? 2 : 0) + (five ? 4 : 0);
            const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
            __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4), _mm_and_si128(bytes, low4));
            if (five) {
                uint32_t qh;
                std::memcpy(&qh, b + 2 + (with_min ? 2 : 0), 4);
                q = _mm256_or_si256(q, fifth_bits(qh));
            }
            if (with_min) {  // d * q + m
                const __m256 m = _mm256_set1_ps(quant::half_at(b + 2));
                store_q32(q, w, [&](__m256 v) { return _mm256_add_ps(_mm256_mul_ps(d, v), m); });
            } else {  // (q - offset) * d, the difference exact in float as in int
                const __m256 offset = _mm256_set1_ps(five ? 16.f : 8.f);
                store_q32(q, w, [&](__m256 v) { return _mm256_mul_ps(_mm256_sub_ps(v, offset), d); });
            }
            return;
        }
        case Format::kQ4_K:
        case Format::kQ5_K: {
            const bool five = f == Format::kQ5_K;
            const __m256i low4y = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
            for (int s = 0; s < 8; ++s) {
                int sc, mn;
                quant::k_scale_min(b + 4, s, &sc, &mn);
                const __m256 ds = _mm256_set1_ps(quant::half_at(b) * static_cast<float>(sc));
                const __m256 dm = _mm256_set1_ps(quant::half_at(b + 2) * static_cast<float>(mn));
                const uint8_t* qs = b + (five ? 48 : 16) + 32 * (s / 2);
                const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
                __m256i q = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(4 * (s % 2))), low4y);
                if (five) {  // bit s of byte 16 + i, to bit 4 (a 0/1 byte shifted within its 16-bit lane stays in it)
                    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
                    const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(s)), one);
                    q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
                }
                store_q32(q, w + 32 * s, [&](__m256 v) { return _mm256_sub_ps(_mm256_mul_ps(ds, v), dm); });
            }
            return;
        }
        case Format::kQ6_K: {  // quant::q6_k's bits, 32 at a time; d * scale per 16 elements
            const float d6 = quant::half_at(b + 208);
            const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
            const __m256i low4y = _mm256_set1_epi8(0x0F), low2y = _mm256_set1_epi8(0x03);
            const __m256 thirty_two = _mm256_set1_ps(32.f);
            for (int s = 0; s < 8; ++s) {
                const int h = s / 4, k = s % 4;
                const __m256i lo = _mm256_and_si256(
                    _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (k % 2))),
                                     _mm_cvtsi32_si128(4 * (k / 2))),
                    low4y);
                const __m256i hi = _mm256_and_si256(
                    _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)),
                                     _mm_cvtsi32_si128(2 * k)),
                    low2y);
                const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // bits 0-1 -> 4-5, within the byte
                const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
                for (int t = 0; t < 2; ++t) {
                    const __m256 dt = _mm256_set1_ps(d6 * static_cast<float>(scales[2 * s + t]));
                    float* out = w + 32 * s + 16 * t;
                    _mm256_storeu_ps(out, _mm256_mul_ps(dt, _mm256_sub_ps(u8_to_ps(halves[t]), thirty_two)));
                    const __m256 upper = u8_to_ps(_mm_srli_si128(halves[t], 8));
                    _mm256_storeu_ps(out + 8, _mm256_mul_ps(dt, _mm256_sub_ps(upper, thirty_two)));
                }
            }
            return;
        }
        default:
            quant::decode_block(f, b, w);
    }
}

// One input row against G decoded weight rows (rows[g * k ...]): 2G accumulators, so the FMA latency is hidden.
template <int G>
void rows_against(const float* rows, int64_t k, const float* xr, float* res) {
    __m256 lo[G], hi[G];
    for (int g = 0; g < G; ++g) lo[g] = hi[g] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; c += 16) {
        const __m256 x0 = _mm256_loadu_ps(xr + c), x1 = _mm256_loadu_ps(xr + c + 8);
        for (int g = 0; g < G; ++g) {
            lo[g] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(rows + g * k + c), lo[g]);
            hi[g] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(rows + g * k + c + 8), hi[g]);
        }
    }
    for (int g = 0; g < G; ++g) res[g] = reduce16(lo[g], hi[g]);
}

// The AVX2 kernel (every CPU this library runs on has AVX2 and FMA): kRows weight rows decoded at a time into an
// L1 scratch, then every input row against them.
void quant_linear_avx2(Format f, const uint8_t* w, int64_t block_bytes, const float* x, const float* bias,
                       float* out, int64_t m, int64_t k, int64_t n) {
    constexpr int64_t kRows = 4;
    const int64_t per = quant::elements(f), blocks = k / per;
    parallel_for(0, (n + kRows - 1) / kRows, 4, [&](int64_t begin, int64_t end) {
        std::vector<float> rows(kRows * k);
        float res[kRows];
        for (int64_t g = begin; g < end; ++g) {
            const int64_t j0 = g * kRows, count = std::min(kRows, n - j0);
            for (int64_t q = 0; q < count; ++q)
                for (int64_t b = 0; b < blocks; ++b)
                    decode_block_avx2(f, w + ((j0 + q) * blocks + b) * block_bytes, rows.data() + q * k + b * per);
            for (int64_t r = 0; r < m; ++r) {
                const float* xr = x + r * k;
                switch (count) {
                    case 4: rows_against<4>(rows.data(), k, xr, res); break;
                    case 3: rows_against<3>(rows.data(), k, xr, res); break;
                    case 2: rows_against<2>(rows.data(), k, xr, res); break;
                    default: rows_against<1>(rows.data(), k, xr, res); break;
                }
                for (int64_t q = 0; q < count; ++q) out[r * n + j0 + q] = res[q] + (bias ? bias[j0 + q] : 0.f);
            }
        }
    });
}

Format checked_format(const at::Tensor& w) {
    TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.is_contiguous(),
                "quant_linear: the weight must be contiguous uint8 blocks [N, blocks, block bytes]");
    const Format f = quant::format_of(w.size(2));
    TORCH_CHECK(f != Format::kUnknown, "quant_linear: no GGUF block format has ", w.size(2),
                " bytes (Q8_0 34, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24, Q4_K 144, Q5_K 176, Q6_K 210)");
    return f;
}

}  // namespace

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
    const Format f = checked_format(w);
    TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                    x.dim() == 2,
                "quant_linear: x must be a float32 or bfloat16 CPU matrix [M, K]");
    if (x.scalar_type() == at::kBFloat16) {
        // bf16 activations widen exactly, meet the same float32 weights and sums, and the result (bias included)
        // rounds to bf16 once, as the bf16 panels round theirs. The widening is O(M K) beside the O(M N K) product.
        return quant_linear(x.to(at::kFloat), w, bias).to(at::kBFloat16);
    }
    const int64_t n = w.size(0), k = w.size(1) * quant::elements(f);
    TORCH_CHECK(x.size(1) == k, "quant_linear: x has ", x.size(1), " columns, the weight ", k);
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "quant_linear: bias must be [N]");
        b = bias->to(at::kFloat).contiguous();
    }
    const auto xc = x.contiguous();
    auto out = at::empty({xc.size(0), n}, x.options());
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    if (xc.size(0) == 0 || n == 0) return out;
    if (cpu_avx512()) {
        quant_linear_avx512(static_cast<int>(f), w.data_ptr<uint8_t>(), w.size(2), xc.data_ptr<float>(), bp,
                            out.data_ptr<float>(), xc.size(0), k, n);
    } else {
        quant_linear_avx2(f, w.data_ptr<uint8_t>(), w.size(2), xc.data_ptr<float>(), bp, out.data_ptr<float>(),
                          xc.size(0), k, n);
    }
    return out;
}

at::Tensor quant_dequantize(const at::Tensor& w) {
    const Format f = checked_format(w);
    const int64_t n = w.size(0), blocks = w.size(1), bytes = w.size(2), per = quant::elements(f);
    auto out = at::empty({n, blocks * per}, at::TensorOptions().dtype(at::kFloat));
    const uint8_t* src = w.data_ptr<uint8_t>();
    float* dst = out.data_ptr<float>();
    parallel_for(0, n * blocks, 1024, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) quant::decode_block(f, src + i * bytes, dst + i * per);
    });
    return out;
}

}  // namespace rtp_llm
