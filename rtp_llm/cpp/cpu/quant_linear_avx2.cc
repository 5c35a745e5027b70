// quant_linear.cc's kernel for CPUs without AVX-512, on quant_pack's interleaved blocks (quant_packed.h): the
// AVX-512 kernel's decode (quant_codecs.h: the same per-lane arithmetic, so the same float32 weights, each exactly
// quant::packed_value's) on 8 lanes, a group-block's 16 rows as two halves of 8.
// - few rows (decode): each vector meets the rows in registers as it is decoded; the weights are streamed once at
//   their stored size;
// - more rows: a 48-column panel is decoded into an fp32 panel (L2) and panel_linear_avx2's tiles run on it.
// Either way each output is one FMA chain over k in order from zero, then + bias: the fp32 panels' bits.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/quant_codecs.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

namespace rtp_llm {
namespace {

using quant::Format;
using quant::kLanes;
using quant::packed_layout;

constexpr int64_t kDirectRows = kQuantDirectRows;
constexpr int64_t kRowChunk = 192;  // rows per decoded panel on the panel path

// quant_codecs.h's vector operations on 8 lanes: part h of a group-block's per-row arrays is rows 8 h .. 8 h + 7.
struct Lanes8 {
    using F = __m256;
    using I = __m256i;
    static F halves(const uint8_t* p, int h) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
    }
    static I bytes(const uint8_t* p, int h) {
        return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
    }
    static I sbytes(const uint8_t* p, int h) {
        return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
    }
    static I words(const uint8_t* p, int h) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h)); }
    static F set1(float x) { return _mm256_set1_ps(x); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
    static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static F fmsub(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
    static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
    static I and_(I v, int m) { return _mm256_and_si256(v, _mm256_set1_epi32(m)); }
    template <int by>
    static I rotl(I v) {
        return _mm256_or_si256(_mm256_slli_epi32(v, by), _mm256_srli_epi32(v, 32 - by));
    }
    template <int by>
    static I srli(I v) {
        return _mm256_srli_epi32(v, by);
    }
    template <int by>
    static I slli(I v) {
        return _mm256_slli_epi32(v, by);
    }
    static F mask_or(I v, int mask, int exponent) {
        return _mm256_castsi256_ps(_mm256_or_si256(and_(v, mask), _mm256_set1_epi32(exponent)));
    }
    // All ones in the lanes whose bit is set in the 16 row bits at p (part h's 8 of them).
    static I lanes_set(const uint8_t* p, int h) {
        uint16_t bits;
        std::memcpy(&bits, p, 2);
        const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((bits >> (8 * h)) & 0xFF), lane_bits), lane_bits);
    }
    static F add_one_where(F v, const uint8_t* bits, int h) {
        return _mm256_add_ps(v, _mm256_and_ps(_mm256_castsi256_ps(lanes_set(bits, h)), _mm256_set1_ps(1.f)));
    }
    static I or16_where(I q, const uint8_t* bits, int h) {
        return _mm256_or_si256(q, _mm256_and_si256(lanes_set(bits, h), _mm256_set1_epi32(16)));
    }
    static I or_masked(I a, I b, int m) { return _mm256_or_si256(a, and_(b, m)); }
};

template <Format F>
using Codec = quant::Codec<Lanes8, F>;

// M rows against G half-groups (8 outputs each: half h of group g at halves[2 g + h]) starting at half `first`,
// decoded in registers; out's columns 8 (half - first) onward (ldo apart), + bias, `cols` of them valid.
template <Format F, int M, int G>
void direct_halves(const uint8_t* w, int64_t group_bytes, const float* x, int64_t k, int64_t first,
                   const float* bias, float* out, int64_t ldo, int cols) {
    using C = Codec<F>;
    constexpr int kE = quant::elements(F);
    constexpr int64_t kBytes = packed_layout(F).bytes;
    __m256 acc[M][G];
    for (int r = 0; r < M; ++r)
        for (int q = 0; q < G; ++q) acc[r][q] = _mm256_setzero_ps();
    const uint8_t* gb[G];
    int hf[G];
    for (int q = 0; q < G; ++q) {
        gb[q] = w + ((first + q) / 2) * group_bytes;
        hf[q] = static_cast<int>((first + q) % 2);
    }
    for (int64_t b = 0; b < k / kE; ++b) {
        const float* xb = x + b * kE;
        for (int s = 0; s < C::kSections; ++s) {
            typename C::Scales sc[G];
            for (int q = 0; q < G; ++q) sc[q] = C::scales(gb[q] + b * kBytes, s, hf[q]);
            for (int u = 0; u < C::kUnits; ++u)
                for (int q = 0; q < G; ++q)
                    C::unit(gb[q] + b * kBytes, sc[q], s, u, hf[q], [&](int e, __m256 v) {
                        for (int r = 0; r < M; ++r)
                            acc[r][q] = _mm256_fmadd_ps(v, _mm256_set1_ps(xb[r * k + e]), acc[r][q]);
                    });
        }
    }
    alignas(32) float tmp[8];
    for (int q = 0; q < G; ++q) {
        const int valid = std::clamp(cols - 8 * q, 0, 8);
        if (valid == 0) break;
        for (int r = 0; r < M; ++r) {
            __m256 v = acc[r][q];
            if (valid == 8) {
                if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + 8 * q));
                _mm256_storeu_ps(out + r * ldo + 8 * q, v);
            } else {
                _mm256_store_ps(tmp, v);
                for (int j = 0; j < valid; ++j) out[r * ldo + 8 * q + j] = bias ? tmp[j] + bias[8 * q + j] : tmp[j];
            }
        }
    }
}

// Groups [g0, g1) decoded into scratch [k, 48] columns 16 (g - g0) onward.
template <Format F>
__attribute__((noipa)) void decode_panel(const uint8_t* w, int64_t group_bytes, int64_t k, int64_t g0, int64_t g1,
                                         float* scratch) {
    using C = Codec<F>;
    constexpr int kE = quant::elements(F);
    for (int64_t b = 0; b < k / kE; ++b) {
        for (int64_t g = g0; g < g1; ++g) {
            const uint8_t* gb = w + g * group_bytes + b * packed_layout(F).bytes;
            for (int h = 0; h < 2; ++h) {
                float* dst = scratch + 16 * (g - g0) + 8 * h + b * kE * kPanelCols;
                for (int s = 0; s < C::kSections; ++s) {
                    const auto sc = C::scales(gb, s, h);
                    for (int u = 0; u < C::kUnits; ++u)
                        C::unit(gb, sc, s, u, h, [&](int e, __m256 v) { _mm256_storeu_ps(dst + e * kPanelCols, v); });
                }
            }
        }
    }
}

template <Format F>
void run(const uint8_t* w, const float* x, const float* bias, float* out, int64_t m, int64_t k, int64_t n) {
    const int64_t group_bytes = k / quant::elements(F) * packed_layout(F).bytes;
    const int64_t groups = (n + kLanes - 1) / kLanes;
    if (m <= kDirectRows) {
        // G half-groups per call: four chains per row up to two rows, two beyond (16 ymm registers; six at one
        // row spilled the slot codecs' scales)
        auto rows = [&](auto mc) {
            constexpr int M = decltype(mc)::value, G = M <= 2 ? 4 : 2;
            const int64_t halves = (n + 7) / 8;
            parallel_for(0, (halves + G - 1) / G, 1, [&](int64_t c0, int64_t c1) {
                for (int64_t c = c0; c < c1; ++c) {
                    const int64_t first = c * G;
                    const int cols = static_cast<int>(std::min<int64_t>(8 * G, n - 8 * first));
                    const float* b = bias ? bias + 8 * first : nullptr;
                    if (first + G <= 2 * groups) {
                        direct_halves<F, M, G>(w, group_bytes, x, k, first, b, out + 8 * first, n, cols);
                    } else {
                        for (int64_t hf = first; hf < std::min<int64_t>(first + G, 2 * groups); ++hf)
                            direct_halves<F, M, 1>(w, group_bytes, x, k, hf, bias ? bias + 8 * hf : nullptr,
                                                   out + 8 * hf, n, static_cast<int>(std::min<int64_t>(8, n - 8 * hf)));
                    }
                }
            });
        };
        switch (m) {
            case 1: return rows(std::integral_constant<int, 1>());
            case 2: return rows(std::integral_constant<int, 2>());
            case 3: return rows(std::integral_constant<int, 3>());
            default: return rows(std::integral_constant<int, 4>());
        }
    }
    constexpr int64_t kGroupsPerPanel = kPanelCols / kLanes;
    const int64_t panels = (n + kPanelCols - 1) / kPanelCols;
    for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, m - r0);
        parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
            float* scratch = quant_thread_panel(k * kPanelCols);
            for (int64_t p = p0; p < p1; ++p) {
                const int64_t g0 = p * kGroupsPerPanel, g1 = std::min(groups, g0 + kGroupsPerPanel);
                decode_panel<F>(w, group_bytes, k, g0, g1, scratch);
                // the next panel's blocks (this range's next, else the range this thread likely claims next),
                // requested while the tiles run, so that its decode reads them from L2
                const int64_t next = p + 1 < p1 ? p + 1 : parallel_for_next_begin();
                const char* ahead =
                    next >= 0 && next < panels ? reinterpret_cast<const char*>(w + next * kGroupsPerPanel * group_bytes)
                                               : nullptr;
                const int64_t lines =
                    ahead ? (std::min(groups - next * kGroupsPerPanel, kGroupsPerPanel) * group_bytes + 63) / 64 : 0;
                const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
                panel_block_fp32_avx2(scratch, x + r0 * k, bias ? bias + p * kPanelCols : nullptr,
                                      out + r0 * n + p * kPanelCols, n, k, cols, rows, ahead, lines);
            }
        });
    }
}

}  // namespace

void quant_linear_avx2(int format, const uint8_t* w, const float* x, const float* bias, float* out, int64_t m,
                       int64_t k, int64_t n) {
    switch (static_cast<Format>(format)) {
        case Format::kQ8_0: return run<Format::kQ8_0>(w, x, bias, out, m, k, n);
        case Format::kQ4_0: return run<Format::kQ4_0>(w, x, bias, out, m, k, n);
        case Format::kQ4_1: return run<Format::kQ4_1>(w, x, bias, out, m, k, n);
        case Format::kQ5_0: return run<Format::kQ5_0>(w, x, bias, out, m, k, n);
        case Format::kQ5_1: return run<Format::kQ5_1>(w, x, bias, out, m, k, n);
        case Format::kQ4_K: return run<Format::kQ4_K>(w, x, bias, out, m, k, n);
        case Format::kQ5_K: return run<Format::kQ5_K>(w, x, bias, out, m, k, n);
        case Format::kQ6_K: return run<Format::kQ6_K>(w, x, bias, out, m, k, n);
        case Format::kUnknown: return;
    }
}

}  // namespace rtp_llm
