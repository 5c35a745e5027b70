// quant_linear.cc's kernel for CPUs with AVX-512 (checked at run time), on quant_pack's interleaved blocks
// (quant_packed.h): a block of 16 rows decodes into k-major vectors of those rows' weights, so the product is the
// fp32 panels' (panel_linear.cc): one FMA chain per output over k in order, from zero, then + bias.
// - few rows (decode): each vector meets the rows in registers as it is decoded, four groups (64 outputs) at a
//   time so that four chains per row hide the FMA latency; the weights are streamed once at their stored size
//   (a gated gate_up: whole panels, the SiLU applied to the registers by the panels' epilogue);
// - more rows: the three groups of a 48-column panel are decoded into an fp32 panel (L2) and panel_linear's tiles
//   run on it for every row block: the decoding is paid once per panel and row chunk (a gated gate_up's SiLU in
//   their epilogue, as pack_gated_panels' copy has it).
#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/panel_tiles.h"
#include "rtp_llm/cpp/cpu/quant_packed.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include "rtp_llm/cpp/cpu/vec/avx512.h"

// quant_codecs.h's templates, compiled here for RTP_AVX512's instruction set
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
#include "rtp_llm/cpp/cpu/quant_codecs.h"
#pragma GCC pop_options

namespace rtp_llm {
namespace {

using quant::Format;
using quant::kLanes;
using quant::packed_layout;

constexpr int64_t kDirectRows = kQuantDirectRows;  // up to this many rows, vectors meet the rows as they are decoded
// Groups (of 16 outputs) in flight per row on that path: 4, whose chains overlap the decode's latency. (Q8_0 ran two
// at one or two rows while its decode was an extraction, a conversion and a multiply: with slot words four are
// 6-12% faster on a 49,152-row LM head, benchmarks/README.md.)
constexpr int kDirectGroups = 4;
constexpr int64_t kRowChunk = 192;   // rows per decoded panel on the panel path (panel_linear.cc's chunk)
// a group's bytes (all of K) from which the few-row path prefetches within it
constexpr int64_t kLongStream = 32 * 1024;

// quant_codecs.h's vector operations on 16 lanes: a group-block's 16 rows at once (part h is always 0).
struct Lanes16 {
    using F = __m512;
    using I = __m512i;
    RTP_AVX512 static F halves(const uint8_t* p, int) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    RTP_AVX512 static I bytes(const uint8_t* p, int) {
        return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    RTP_AVX512 static I sbytes(const uint8_t* p, int) {
        return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    RTP_AVX512 static I words(const uint8_t* p, int) { return _mm512_loadu_si512(p); }
    RTP_AVX512 static F set1(float x) { return _mm512_set1_ps(x); }
    RTP_AVX512 static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    RTP_AVX512 static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
    RTP_AVX512 static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    RTP_AVX512 static F fmsub(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
    RTP_AVX512 static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
    RTP_AVX512 static I and_(I v, int m) { return _mm512_and_si512(v, _mm512_set1_epi32(m)); }
    template <int by>
    RTP_AVX512 static I rotl(I v) {
        return _mm512_rol_epi32(v, by);
    }
    template <int by>
    RTP_AVX512 static I srli(I v) {
        return _mm512_srli_epi32(v, by);
    }
    template <int by>
    RTP_AVX512 static I slli(I v) {
        return _mm512_slli_epi32(v, by);
    }
    // (v & mask) | exponent in one instruction (0xEA: (A & B) | C)
    RTP_AVX512 static F mask_or(I v, int mask, int exponent) {
        return _mm512_castsi512_ps(
            _mm512_ternarylogic_epi32(v, _mm512_set1_epi32(mask), _mm512_set1_epi32(exponent), 0xEA));
    }
    RTP_AVX512 static __mmask16 mask_at(const uint8_t* p) {
        uint16_t bits;
        std::memcpy(&bits, p, 2);
        return static_cast<__mmask16>(bits);
    }
    RTP_AVX512 static F add_one_where(F v, const uint8_t* bits, int) {
        return _mm512_mask_add_ps(v, mask_at(bits), v, _mm512_set1_ps(1.f));
    }
    RTP_AVX512 static I or16_where(I q, const uint8_t* bits, int) {
        return _mm512_mask_or_epi32(q, mask_at(bits), q, _mm512_set1_epi32(16));
    }
    // a | (b & m) in one instruction (0xF8: A | (B & C))
    RTP_AVX512 static I or_masked(I a, I b, int m) {
        return _mm512_ternarylogic_epi32(a, b, _mm512_set1_epi32(m), 0xF8);
    }
};

template <Format F>
using Codec = quant::Codec<Lanes16, F>;

// M rows (M <= kDirectRows) against G consecutive groups from w (each group's blocks at group_bytes apart),
// decoded in registers: acc[r][q] lane l = output 16 q + l. The G groups at `ahead` (null: none) are requested
// meanwhile.
template <Format F, int M, int G>
RTP_AVX512 __attribute__((always_inline)) inline void direct_sums(const uint8_t* w, int64_t group_bytes,
                                                                  const float* x, int64_t k, const char* ahead,
                                                                  __m512 (&acc)[M][G]) {
    using C = Codec<F>;
    constexpr quant::PackedLayout L = packed_layout(F);
    constexpr int kE = quant::elements(F);
    for (int r = 0; r < M; ++r)
        for (int q = 0; q < G; ++q) acc[r][q] = _mm512_setzero_ps();
    const int64_t blocks = k / kE;
    // Long group streams (a k-quant's 4864 columns: 45-64 KB each) are requested ~1 KB ahead within each stream
    // instead: the G streams of the next span would be too far ahead, and the current span's own would be left to
    // the hardware prefetcher.
    if (group_bytes >= kLongStream) ahead = reinterpret_cast<const char*>(w) + (1024 + L.bytes - 1) / L.bytes * L.bytes;
    constexpr int kLinesPerBlock = (L.bytes + 63) / 64;
    constexpr int kLinesPerSection = (kLinesPerBlock + C::kSections - 1) / C::kSections;
    for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = x + b * kE;
        for (int s = 0; s < C::kSections; ++s) {
            // the next span's group-blocks, a section's share of their lines per section (a burst of a k-quant
            // block's 150-200 requests overflowed the miss queues); a hint past the end is dropped, never a fault
            for (int q = 0; q < (ahead ? G : 0); ++q)
                for (int i = s * kLinesPerSection; i < std::min(kLinesPerBlock, (s + 1) * kLinesPerSection); ++i)
                    __builtin_prefetch(ahead + q * group_bytes + b * L.bytes + 64 * i, 0, 2);
            typename C::Scales sc[G];
            for (int q = 0; q < G; ++q) sc[q] = C::scales(w + q * group_bytes + b * L.bytes, s, 0);
            for (int u = 0; u < C::kUnits; ++u) {
                for (int q = 0; q < G; ++q) {
                    C::unit(w + q * group_bytes + b * L.bytes, sc[q], s, u, 0, [&](int e, __m512 v) RTP_AVX512 {
                        for (int r = 0; r < M; ++r)
                            acc[r][q] = _mm512_fmadd_ps(v, _mm512_set1_ps(xb[r * k + e]), acc[r][q]);
                    });
                }
            }
        }
    }
}

// direct_sums stored: out's columns [0, cols) of M rows (ldo apart), + bias.
template <Format F, int M, int G>
RTP_AVX512 void direct_groups(const uint8_t* w, int64_t group_bytes, const float* x, int64_t k, const float* bias,
                              float* out, int64_t ldo, int cols, const char* ahead) {
    __m512 acc[M][G];
    direct_sums<F, M, G>(w, group_bytes, x, k, ahead, acc);
    for (int q = 0; q < G; ++q) {
        const int valid = std::clamp(cols - 16 * q, 0, 16);
        if (valid == 0) break;
        const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * q) : _mm512_setzero_ps();
        for (int r = 0; r < M; ++r)
            _mm512_mask_storeu_ps(out + r * ldo + 16 * q, mask, bias ? _mm512_add_ps(acc[r][q], bv) : acc[r][q]);
    }
}

// The gated few-row path: P panels of pack_gated_panels' order (3 groups each: 24 gate, 24 up outputs) in
// registers, then each panel through the panel tiles' SiLU epilogue (panel_tiles.h), so the bits are the panel
// path's and silu_and_mul's, without [gate | up] leaving the registers. out / bias: the first panel's 24 output
// columns / 48 bias entries; cols, exact_from: as gated_store's, counted from out.
template <Format F, int M, int P>
RTP_AVX512_BF16 void direct_gated(const uint8_t* w, int64_t group_bytes, const float* x, int64_t k,
                                  const float* bias, float* out, int64_t ldo, int cols, int exact_from,
                                  const char* ahead) {
    constexpr int kOut = kPanelCols / 2, kGroups = kPanelCols / kLanes;
    __m512 acc[M][P * kGroups];
    direct_sums<F, M, P * kGroups>(w, group_bytes, x, k, ahead, acc);
    for (int p = 0; p < P; ++p) {
        __m512 tile[M][kGroups];
        for (int r = 0; r < M; ++r)
            for (int q = 0; q < kGroups; ++q) tile[r][q] = acc[r][p * kGroups + q];
        panel::gated_store<panel::Fp32, M>(tile, bias ? bias + p * kPanelCols : nullptr, out + p * kOut, ldo,
                                           std::min(cols - p * kOut, kOut), exact_from - p * kOut);
    }
}

template <Format F, int M>
RTP_AVX512 void direct_m(const uint8_t* w, int64_t group_bytes, const float* x, const float* bias, float* out,
                         int64_t k, int64_t n, int64_t g0, int64_t g1) {
    constexpr int G = kDirectGroups;
    // a step requests the groups of the next one in this range, else the first of the range this thread will most
    // likely claim next: past the range they are likely another thread's (at N = 896, 14 steps in all)
    auto ahead = [&](int64_t next) -> const char* {
        if (next < g1) return reinterpret_cast<const char*>(w + next * group_bytes);
        const int64_t c = parallel_for_next_begin();
        return c >= 0 ? reinterpret_cast<const char*>(w + c * G * group_bytes) : nullptr;
    };
    int64_t g = g0;
    for (; g + G <= g1; g += G)
        direct_groups<F, M, G>(w + g * group_bytes, group_bytes, x, k, bias ? bias + 16 * g : nullptr, out + 16 * g, n,
                               static_cast<int>(std::min<int64_t>(16 * G, n - 16 * g)), ahead(g + G));
    for (; g < g1; ++g)
        direct_groups<F, M, 1>(w + g * group_bytes, group_bytes, x, k, bias ? bias + 16 * g : nullptr, out + 16 * g,
                               n, static_cast<int>(std::min<int64_t>(16, n - 16 * g)), ahead(g + 1));
}

// Gated panels [p0, p1) for M rows: two panels at a time (six chains per row) up to two rows, one beyond (the
// accumulators of two would not fit the registers); n: the activation's width I.
template <Format F, int M>
void direct_gated_m(const uint8_t* w, int64_t group_bytes, const float* x, const float* bias, float* out, int64_t k,
                    int64_t n, int64_t p0, int64_t p1) {
    constexpr int64_t kOut = kPanelCols / 2, kGroups = kPanelCols / kLanes;
    constexpr int P = M <= 2 ? 2 : 1;
    auto ahead = [&](int64_t next) -> const char* {  // as direct_m's: the next panels, else the next claimed range
        if (next < p1) return reinterpret_cast<const char*>(w + next * kGroups * group_bytes);
        const int64_t c = parallel_for_next_begin();
        return c >= 0 ? reinterpret_cast<const char*>(w + c * P * kGroups * group_bytes) : nullptr;
    };
    const int64_t vector_cols = n & ~int64_t{7};  // activation.cc's vector loop; the rest its scalar tail
    auto at = [&](int64_t p, auto panels) {
        constexpr int Q = decltype(panels)::value;
        direct_gated<F, M, Q>(w + p * kGroups * group_bytes, group_bytes, x, k, bias ? bias + p * kPanelCols : nullptr,
                              out + p * kOut, n, static_cast<int>(std::min<int64_t>(Q * kOut, n - p * kOut)),
                              static_cast<int>(vector_cols - p * kOut), ahead(p + Q));
    };
    int64_t p = p0;
    for (; p + P <= p1; p += P) at(p, std::integral_constant<int, P>());
    for (; p < p1; ++p) at(p, std::integral_constant<int, 1>());
}

// Groups [g0, g1) decoded into scratch [k, 48] columns 16 (g - g0) onward. noipa (here, decode_pair_panel and
// packed_row): GCC 12 at -O3 dropped calls of these for the 5-bit formats, whose decode has mask operations (its
// interprocedural analysis took them for functions without side effects; the tests caught it).
template <Format F>
__attribute__((noipa)) RTP_AVX512 void decode_panel(const uint8_t* w, int64_t group_bytes, int64_t k, int64_t g0,
                                                    int64_t g1, float* scratch) {
    using C = Codec<F>;
    constexpr int kE = quant::elements(F);
    // block by block across the groups, so that each 192-byte row of the panel is written whole while in L1
    for (int64_t b = 0; b < k / kE; ++b) {
        for (int64_t g = g0; g < g1; ++g) {
            const uint8_t* gb = w + g * group_bytes + b * packed_layout(F).bytes;
            float* dst = scratch + 16 * (g - g0) + b * kE * kPanelCols;
            for (int s = 0; s < C::kSections; ++s) {
                const auto sc = C::scales(gb, s, 0);
                for (int u = 0; u < C::kUnits; ++u)
                    C::unit(gb, sc, s, u, 0,
                            [&](int e, __m512 v) RTP_AVX512 { _mm512_storeu_ps(dst + e * kPanelCols, v); });
            }
        }
    }
}

// The blocks of the panel this thread decodes after panel p (the next in its range [.., p1), else the first of
// the range it will likely claim next), requested while the current panel's tiles run so that the decoding reads
// them from L2: their start and cache lines (null, 0: none).
std::pair<const char*, int64_t> next_panel_blocks(const uint8_t* w, int64_t group_bytes, int64_t groups, int64_t p,
                                                  int64_t p1) {
    constexpr int64_t kGroupsPerPanel = kPanelCols / kLanes;
    const int64_t next = p + 1 < p1 ? p + 1 : parallel_for_next_begin();
    if (next < 0) return {nullptr, 0};
    return {reinterpret_cast<const char*>(w + next * kGroupsPerPanel * group_bytes),
            (std::min(groups - next * kGroupsPerPanel, kGroupsPerPanel) * group_bytes + 63) / 64};
}

// Gated: the rows are pack_gated_panels' order and n is the activation's width I (ceil(I / 24) panels of 24 gate
// and 24 up columns, bias in that order): out [m, I] = silu(gate) * up from the tiles' epilogue (or direct_gated's).
template <Format F, bool Gated = false>
void run(const uint8_t* w, const float* x, const float* bias, float* out, int64_t m, int64_t k, int64_t n) {
    constexpr int64_t kOut = Gated ? kPanelCols / 2 : kPanelCols;  // output columns per panel
    const int64_t panels = (n + kOut - 1) / kOut;
    const int64_t group_bytes = k / quant::elements(F) * packed_layout(F).bytes;
    const int64_t groups = Gated ? panels * (kPanelCols / kLanes) : (n + kLanes - 1) / kLanes;
    if (m <= kDirectRows) {
        // ranges of kDirectGroups groups, so that a range's outputs run that many chains per row; gated: of whole
        // panels, two at a time up to two rows
        auto rows = [&](auto mc) {
            constexpr int M = decltype(mc)::value;
            if constexpr (Gated) {
                constexpr int P = M <= 2 ? 2 : 1;
                parallel_for(0, (panels + P - 1) / P, 1, [&](int64_t c0, int64_t c1) {
                    direct_gated_m<F, M>(w, group_bytes, x, bias, out, k, n, c0 * P, std::min(panels, c1 * P));
                });
            } else {
                constexpr int G = kDirectGroups;
                parallel_for(0, (groups + G - 1) / G, 1, [&](int64_t c0, int64_t c1) {
                    direct_m<F, M>(w, group_bytes, x, bias, out, k, n, c0 * G, std::min(groups, c1 * G));
                });
            }
        };
        switch (m) {
            case 1: return rows(std::integral_constant<int, 1>());
            case 2: return rows(std::integral_constant<int, 2>());
            case 3: return rows(std::integral_constant<int, 3>());
            default: return rows(std::integral_constant<int, 4>());
        }
    }
    constexpr int64_t kGroupsPerPanel = kPanelCols / kLanes;
    for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, m - r0);
        parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
            float* scratch = quant_thread_panel(k * kPanelCols);
            for (int64_t p = p0; p < p1; ++p) {
                const int64_t g0 = p * kGroupsPerPanel, g1 = std::min(groups, g0 + kGroupsPerPanel);
                decode_panel<F>(w, group_bytes, k, g0, g1, scratch);
                const auto [ahead, lines] = next_panel_blocks(w, group_bytes, groups, p, p1);
                const float* b = bias ? bias + p * kPanelCols : nullptr;
                float* o = out + r0 * n + p * kOut;
                const int cols = static_cast<int>(std::min<int64_t>(kOut, n - p * kOut));
                if constexpr (Gated) {
                    // activation.cc's vector loop covers the columns below I rounded down to 8 (panel_linear.cc)
                    const int exact_from = static_cast<int>(std::min<int64_t>(kOut, (n & ~int64_t{7}) - p * kOut));
                    panel_block_silu_fp32(scratch, x + r0 * k, b, o, n, k, cols, exact_from, rows, ahead, lines);
                } else {
                    panel_block_fp32(scratch, x + r0 * k, b, o, n, k, cols, rows, ahead, lines);
                }
            }
        });
    }
}

// decode_panel's weights rounded to bf16 (to nearest even, as c10::BFloat16 rounds them) as a pair panel
// [k / 2, 48] (element 2i in the low half, 2i + 1 in the high): greedy_head's screen of a packed head.
// vcvtne2ps2bf16 rounds to nearest even but reads denormal weights as zero: a change of at most 2^-126 per weight
// from the rounding greedy_bounds assumes, inside the screen's constant term (greedy_head.cc's c0).
template <Format F>
__attribute__((noipa)) RTP_AVX512_BF16 void decode_pair_panel(const uint8_t* w, int64_t group_bytes, int64_t k,
                                                              int64_t g0, int64_t g1, uint32_t* scratch) {
    using C = Codec<F>;
    constexpr int kE = quant::elements(F);
    // [even 0-15 | odd 0-15] as 16-bit elements -> lane i = (even i, odd i)
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t b = 0; b < k / kE; ++b) {
        for (int64_t g = g0; g < g1; ++g) {
            const uint8_t* gb = w + g * group_bytes + b * packed_layout(F).bytes;
            uint32_t* dst = scratch + 16 * (g - g0) + b * (kE / 2) * kPanelCols;
            __m512 even = _mm512_setzero_ps();  // element 2i, until 2i + 1 comes
            for (int s = 0; s < C::kSections; ++s) {
                const auto sc = C::scales(gb, s, 0);
                for (int u = 0; u < C::kUnits; ++u)
                    C::unit(gb, sc, s, u, 0, [&](int e, __m512 v) RTP_AVX512_BF16 {
                        if ((e & 1) == 0) {
                            even = v;
                            return;
                        }
                        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(v, even);
                        _mm512_storeu_si512(dst + (e / 2) * kPanelCols, _mm512_permutexvar_epi16(interleave, both));
                    });
            }
        }
    }
}

template <Format F>
void screen(const uint8_t* w, const uint32_t* x_pairs, float* out, int64_t m, int64_t k, int64_t n) {
    const int64_t group_bytes = k / quant::elements(F) * packed_layout(F).bytes;
    const int64_t groups = (n + kLanes - 1) / kLanes, pairs = k / 2;
    constexpr int64_t kGroupsPerPanel = kPanelCols / kLanes;
    const int64_t panels = (n + kPanelCols - 1) / kPanelCols;
    for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, m - r0);
        parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
            auto* scratch = reinterpret_cast<uint32_t*>(quant_thread_panel(pairs * kPanelCols));
            // AMX tiles where the CPU has them (the screen's bound holds for their sums as for vdpbf16ps's)
            std::optional<panel::AmxRows> amx;
            if (panel::amx_panels(pairs)) amx.emplace(x_pairs, m, pairs);
            for (int64_t p = p0; p < p1; ++p) {
                const int64_t g0 = p * kGroupsPerPanel, g1 = std::min(groups, g0 + kGroupsPerPanel);
                decode_pair_panel<F>(w, group_bytes, k, g0, g1, scratch);
                // as in run(): without this request the decoding waited on memory for each block (a Q8_0 head
                // at 32 rows: the decode as long as the bf16 tiles)
                const auto [ahead, lines] = next_panel_blocks(w, group_bytes, groups, p, p1);
                const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - p * kPanelCols));
                if (amx)
                    amx->store_panel(scratch, r0, rows, out + r0 * n + p * kPanelCols, n, cols, ahead, lines);
                else
                    panel_block_bf16(scratch, x_pairs + r0 * pairs, out + r0 * n + p * kPanelCols, n, pairs, cols,
                                     rows, ahead, lines);
            }
        });
    }
}

// Row `row` of a packed weight: its group's blocks decoded, lane row % 16 kept.
template <Format F>
__attribute__((noipa)) RTP_AVX512 void packed_row(const uint8_t* w, int64_t k, int64_t row, float* out) {
    using C = Codec<F>;
    constexpr int kE = quant::elements(F);
    const int64_t group_bytes = k / kE * packed_layout(F).bytes;
    const uint8_t* g = w + (row / kLanes) * group_bytes;
    const __mmask16 lane = static_cast<__mmask16>(1u << (row % kLanes));
    for (int64_t b = 0; b < k / kE; ++b) {
        const uint8_t* gb = g + b * packed_layout(F).bytes;
        for (int s = 0; s < C::kSections; ++s) {
            const auto sc = C::scales(gb, s, 0);
            for (int u = 0; u < C::kUnits; ++u)
                C::unit(gb, sc, s, u, 0, [&](int e, __m512 v) RTP_AVX512 {
                    _mm512_mask_compressstoreu_ps(out + b * kE + e, lane, v);
                });
        }
    }
}

template <typename Fn>
void by_format(int format, Fn&& fn) {
    switch (static_cast<Format>(format)) {
        case Format::kQ8_0: return fn(std::integral_constant<Format, Format::kQ8_0>());
        case Format::kQ4_0: return fn(std::integral_constant<Format, Format::kQ4_0>());
        case Format::kQ4_1: return fn(std::integral_constant<Format, Format::kQ4_1>());
        case Format::kQ5_0: return fn(std::integral_constant<Format, Format::kQ5_0>());
        case Format::kQ5_1: return fn(std::integral_constant<Format, Format::kQ5_1>());
        case Format::kQ4_K: return fn(std::integral_constant<Format, Format::kQ4_K>());
        case Format::kQ5_K: return fn(std::integral_constant<Format, Format::kQ5_K>());
        case Format::kQ6_K: return fn(std::integral_constant<Format, Format::kQ6_K>());
        case Format::kUnknown: return;
    }
}

}  // namespace

void quant_screen_avx512(int format, const uint8_t* w, const uint32_t* x_pairs, float* out, int64_t m, int64_t k,
                         int64_t n) {
    by_format(format, [&](auto f) { screen<decltype(f)::value>(w, x_pairs, out, m, k, n); });
}

void quant_row_avx512(int format, const uint8_t* w, int64_t k, int64_t row, float* out) {
    by_format(format, [&](auto f) { packed_row<decltype(f)::value>(w, k, row, out); });
}

void quant_linear_avx512(int format, const uint8_t* w, const float* x, const float* bias, float* out, int64_t m,
                         int64_t k, int64_t n) {
    by_format(format, [&](auto f) { run<decltype(f)::value>(w, x, bias, out, m, k, n); });
}

void quant_linear_silu_avx512(int format, const uint8_t* w, const float* x, const float* bias, float* out, int64_t m,
                              int64_t k, int64_t inter) {
    by_format(format, [&](auto f) { run<decltype(f)::value, true>(w, x, bias, out, m, k, inter); });
}

}  // namespace rtp_llm

#else

namespace rtp_llm {
void quant_linear_avx512(int, const uint8_t*, const float*, const float*, float*, int64_t, int64_t, int64_t) {}
void quant_screen_avx512(int, const uint8_t*, const uint32_t*, float*, int64_t, int64_t, int64_t) {}
void quant_row_avx512(int, const uint8_t*, int64_t, int64_t, float*) {}
void quant_linear_silu_avx512(int, const uint8_t*, const float*, const float*, float*, int64_t, int64_t, int64_t) {}
}  // namespace rtp_llm

#endif
