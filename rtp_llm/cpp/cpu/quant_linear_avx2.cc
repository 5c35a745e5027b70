// quant_linear.cc's kernel for CPUs without AVX-512, on quant_pack's interleaved blocks (quant_packed.h): the
// AVX-512 kernel's decode (quant_linear_avx512.cc's codecs: the same per-lane arithmetic, so the same float32
// weights, each exactly quant::packed_value's) on 8 lanes, a group-block's 16 rows as two halves of 8.
// - few rows (decode): each vector meets the rows in registers as it is decoded; the weights are streamed once at
//   their stored size;
// - more rows: a 48-column panel is decoded into an fp32 panel (L2) and panel_linear_avx2's tiles run on it.
// Either way each output is one FMA chain over k in order from zero, then + bias: the fp32 panels' bits.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/quant_packed.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

namespace rtp_llm {
namespace {

using quant::Format;
using quant::kLanes;
using quant::packed_layout;

constexpr int64_t kDirectRows = kQuantDirectRows;
constexpr int64_t kRowChunk = 192;  // rows per decoded panel on the panel path

// Loads of half h (rows 8 h .. 8 h + 7) of a group-block's per-row arrays.
inline __m256 halves8(const uint8_t* p, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
}
inline __m256i bytes8(const uint8_t* p, int h) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
}
inline __m256i words8(const uint8_t* p, int h) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
}
// All ones in the lanes whose bit is set in the 16 row bits at p (half h's 8 of them).
inline __m256i lanes_set(const uint8_t* p, int h) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32((bits >> (8 * h)) & 0xFF), lane_bits);
    return _mm256_cmpeq_epi32(b, lane_bits);
}
inline __m256i rotl(__m256i v, int by) {
    return _mm256_or_si256(_mm256_slli_epi32(v, by), _mm256_srli_epi32(v, 32 - by));
}
// (v & mask) | exponent, as a float
inline __m256 mask_or(__m256i v, int mask, int exponent) {
    return _mm256_castsi256_ps(
        _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(mask)), _mm256_set1_epi32(exponent)));
}

struct Scales {
    __m256 a, b;
};

template <Format F>
struct Codec;

// Q8_0: slot words of bytes; 256 d f + c_p = d q exactly (quant_linear_avx512.cc's Codec<kQ8_0>).
template <>
struct Codec<Format::kQ8_0> {
    static constexpr quant::PackedLayout L = packed_layout(Format::kQ8_0);
    static constexpr int kSections = 1, kUnits = 8;
    using Scales = rtp_llm::Scales;
    static Scales scales(const uint8_t* g, int, int h) {
        const __m256 d = halves8(g + L.d, h);
        return {_mm256_mul_ps(d, _mm256_set1_ps(256.f)), _mm256_mul_ps(d, _mm256_set1_ps(-384.f))};
    }
    template <typename Emit>
    static __attribute__((always_inline)) inline void unit(const uint8_t* g, const Scales& sc, int, int u, int h,
                                                           Emit&& emit) {
        const __m256i w = words8(g + L.q + 64 * u, h);
        const __m256i rotated[2] = {w, rotl(w, 16)};
        const __m256 c7 = _mm256_mul_ps(sc.b, _mm256_set1_ps(171.f));  // -65664 d: exact
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const int j = i % 2;  // slot: bit 15 - 8 j, exponent 127 + 8 j
            const __m256 f = mask_or(rotated[i / 2], 0xFF << (15 - 8 * j), (127 + 8 * j) << 23);
            emit(4 * u + i, _mm256_fmadd_ps(sc.a, f, j ? c7 : sc.b));
        }
    }
};

// Q4_0, Q4_1, Q5_0: slot words of nibbles; 16 d f + c_p = d q + m exactly before the one rounding.
struct SlotScales {
    __m256 d16, c[3];
};

template <Format F>
struct SlotCodec {
    static constexpr quant::PackedLayout L = packed_layout(F);
    static constexpr int kSections = 1, kUnits = 4;
    using Scales = SlotScales;
    static Scales scales(const uint8_t* g, int, int h) {
        const __m256 d = halves8(g + L.d, h);
        Scales sc;
        sc.d16 = _mm256_mul_ps(d, _mm256_set1_ps(16.f));
        for (int j = 0; j < 3; ++j) {
            const float step = static_cast<float>(1 << quant::kSlotShift[j]);
            if constexpr (F == Format::kQ4_1) {  // m - d 2^s: exact, or quant_pack made the tensor Q5_1
                sc.c[j] = _mm256_sub_ps(halves8(g + L.m, h), _mm256_mul_ps(d, _mm256_set1_ps(step)));
            } else {  // -(8 + 2^s) d, Q5_0 -(16 + 2^s) d: exact
                sc.c[j] = _mm256_mul_ps(d, _mm256_set1_ps(-((F == Format::kQ5_0 ? 16.f : 8.f) + step)));
            }
        }
        return sc;
    }
    template <typename Emit>
    static __attribute__((always_inline)) inline void unit(const uint8_t* g, const Scales& sc, int, int u, int h,
                                                           Emit&& emit) {
        const __m256i w = words8(g + L.q + 64 * u, h);
        const __m256i rotated[3] = {w, rotl(w, 12), rotl(w, 24)};
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
            const int j = i % 3;  // slot: bit 19 - 4 j, exponent 127 + 4 j
            __m256 v = mask_or(rotated[i / 3], 0xF << (19 - 4 * j), (127 + 4 * j) << 23);
            if constexpr (F == Format::kQ5_0)  // the fifth bit: + 1, exact
                v = _mm256_add_ps(v, _mm256_and_ps(_mm256_castsi256_ps(lanes_set(g + L.fifth + 2 * (8 * u + i), h)),
                                                   _mm256_set1_ps(1.f)));
            emit(8 * u + i, _mm256_fmadd_ps(sc.d16, v, sc.c[j]));
        }
    }
};

template <>
struct Codec<Format::kQ4_0> : SlotCodec<Format::kQ4_0> {};
template <>
struct Codec<Format::kQ4_1> : SlotCodec<Format::kQ4_1> {};
template <>
struct Codec<Format::kQ5_0> : SlotCodec<Format::kQ5_0> {};

// Q5_1, Q4_K, Q5_K: nibble bytes of two elements each; every product exact, one rounding.
template <Format F>
struct Codec {
    static_assert(F == Format::kQ5_1 || F == Format::kQ4_K || F == Format::kQ5_K, "the nibble formats");
    using Scales = rtp_llm::Scales;
    static constexpr bool kK = F == Format::kQ4_K || F == Format::kQ5_K;
    static constexpr bool kFive = F == Format::kQ5_1 || F == Format::kQ5_K;
    static constexpr quant::PackedLayout L = packed_layout(F);
    static constexpr int kSections = kK ? 8 : 1, kUnits = 16;
    static Scales scales(const uint8_t* g, int s, int h) {
        if constexpr (kK) {  // d * sc, dmin * m
            return {_mm256_mul_ps(halves8(g + L.d, h), _mm256_cvtepi32_ps(bytes8(g + L.sc + 16 * s, h))),
                    _mm256_mul_ps(halves8(g + L.m, h), _mm256_cvtepi32_ps(bytes8(g + L.mn + 16 * s, h)))};
        } else {
            return {halves8(g + L.d, h), halves8(g + L.m, h)};
        }
    }
    template <typename Emit>
    static __attribute__((always_inline)) inline void unit(const uint8_t* g, const Scales& sc, int s, int u, int h,
                                                           Emit&& emit) {
        const int e0 = 32 * s + 2 * u;
        const __m256i bytes = bytes8(g + L.q + 8 * e0, h);
        __m256i q[2] = {_mm256_and_si256(bytes, _mm256_set1_epi32(0x0F)), _mm256_srli_epi32(bytes, 4)};
        for (int hh = 0; hh < 2; ++hh) {
            if constexpr (kFive)
                q[hh] = _mm256_or_si256(q[hh], _mm256_and_si256(lanes_set(g + L.fifth + 2 * (e0 + hh), h),
                                                                _mm256_set1_epi32(16)));
            const __m256 qf = _mm256_cvtepi32_ps(q[hh]);
            emit(e0 + hh, kK ? _mm256_fmsub_ps(sc.a, qf, sc.b) : _mm256_fmadd_ps(sc.a, qf, sc.b));
        }
    }
};

template <>
struct Codec<Format::kQ6_K> {
    static constexpr quant::PackedLayout L = packed_layout(Format::kQ6_K);
    using Scales = rtp_llm::Scales;
    static constexpr int kSections = 16, kUnits = 4;
    static Scales scales(const uint8_t* g, int t, int h) {
        const __m256i sc =
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(g + L.sc + 16 * t + 8 * h)));
        const __m256 dsc = _mm256_mul_ps(halves8(g + L.d, h), _mm256_cvtepi32_ps(sc));
        return {dsc, _mm256_mul_ps(dsc, _mm256_set1_ps(-32.f))};
    }
    template <typename Emit>
    static __attribute__((always_inline)) inline void unit(const uint8_t* g, const Scales& sc, int t, int u, int h,
                                                           Emit&& emit) {
        const int e0 = 16 * t + 4 * u;
        const __m256i high = bytes8(g + L.hi + 4 * e0, h);
        for (int p = 0; p < 2; ++p) {
            const __m256i bytes = bytes8(g + L.q + 8 * (e0 + 2 * p), h);
            for (int hh = 0; hh < 2; ++hh) {
                const int j = 2 * p + hh;  // the element's bits 4-5: high's bits 2j, 2j + 1, moved to 4-5
                const __m256i lo = hh ? _mm256_srli_epi32(bytes, 4) : _mm256_and_si256(bytes, _mm256_set1_epi32(0x0F));
                const __m256i moved = j < 2 ? _mm256_slli_epi32(high, 4 - 2 * j)
                                            : (j == 2 ? high : _mm256_srli_epi32(high, 2));
                const __m256i q = _mm256_or_si256(lo, _mm256_and_si256(moved, _mm256_set1_epi32(0x30)));
                emit(e0 + j, _mm256_fmadd_ps(sc.a, _mm256_cvtepi32_ps(q), sc.b));
            }
        }
    }
};

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
