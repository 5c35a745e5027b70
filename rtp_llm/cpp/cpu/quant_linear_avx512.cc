// quant_linear.cc's kernel for CPUs with AVX-512 (checked at run time). Two ways through, the same sums:
// - few rows (decode): each weight block is decoded in registers and meets every row there, so the weights are
//   streamed once at their stored size;
// - more rows (prefill, large batches): a panel of 32 weight rows is decoded once into a float32 scratch (L2);
//   then 8 of its rows over a column tile sit in L1 while every input row of a block, three at a time, meets them:
//   the decoding is paid once per panel, and the weights are read from L2 once per block of input rows.
// Both accumulate lane l over the 16-wide chunks in order and reduce with avx512::reduce1's tree (reduce8 is the
// same tree for 8 vectors), as quant_linear.cc's AVX2 kernel does.
#include <ATen/Parallel.h>

#include <vector>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include "rtp_llm/cpp/cpu/vec/avx512.h"

namespace rtp_llm {
namespace {

using avx512::reduce1;
using avx512::reduce8;
using quant::Format;
using quant::half_at;
using quant::kBlock;

constexpr int64_t kDirectRows = 4;  // up to this many rows, blocks are decoded in registers per row group
constexpr int kGroup = 8;           // weight rows one pass of the FMA loop takes (8 accumulators per input row)
constexpr int64_t kPanel = 32;      // weight rows decoded together into the scratch (in L2), in groups of kGroup

RTP_AVX512 inline __m512i bytes_to_epi32(__m128i v) { return _mm512_cvtepu8_epi32(v); }

// Bytes >> shift & mask, 16 of them (the shift crosses into neighbouring bytes only in bits the mask drops).
RTP_AVX512 inline __m128i bits_of(__m128i v, int shift, int mask) {
    return _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm_set1_epi8(static_cast<char>(mask)));
}

// The 4-bit formats' 16 possible weights of a (sub-)block, table[q] = scale * q (+ or -) offset with gguf's
// arithmetic (a product, then a sum, each rounded to float32), looked up for 16 weights at once (vpermps reads an
// index's low 4 bits): the same float32 values as converting every nibble and scaling it, in about half the
// instructions; a decode step is instruction-bound (benchmarks/README.md).
RTP_AVX512 inline __m512 nibble_values(__m512 scale, __m512 offset, bool subtract, bool centred) {
    const __m512 q = centred ? _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                             : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 scaled = _mm512_mul_ps(scale, q);
    if (centred) return scaled;
    return subtract ? _mm512_sub_ps(scaled, offset) : _mm512_add_ps(scaled, offset);
}

// The fp16 at p in all 16 lanes: a broadcast load and one conversion (not a scalar conversion, then a broadcast).
RTP_AVX512 inline __m512 half_lanes(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(bits)));
}

// 16 bytes, each to a 32-bit lane: its low nibble in bits 0-3 (shift 0) or its high nibble (shift 4), the table's
// index.
RTP_AVX512 inline void nibble_lookup(const uint8_t* bytes, int shift, __m512 table, __m512& w) {
    const __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
    w = _mm512_permutexvar_ps(shift ? _mm512_srli_epi32(wide, 4) : wide, table);
}

// A Q4_K / Q5_K block's eight sub-block scales and mins, each product rounded as gguf's (d * sc, dmin * m): worked
// out once per block where a step decodes all eight sub-blocks of it, not once per sub-block.
struct KScales {
    float ds[8], dm[8];
};

inline void k_scales(const uint8_t* b, KScales& ks) {
    const float d = half_at(b), dmin = half_at(b + 2);
    for (int s = 0; s < 8; ++s) {
        int sc, m;
        quant::k_scale_min(b + 4, s, &sc, &m);
        ks.ds[s] = d * static_cast<float>(sc);
        ks.dm[s] = dmin * static_cast<float>(m);
    }
}

inline constexpr bool has_k_scales(Format f) { return f == Format::kQ4_K || f == Format::kQ5_K; }

// Sub-block s of a Q4_K / Q5_K block with its scale ds and min dm.
template <Format F>
RTP_AVX512 inline void decode_k(const uint8_t* b, int s, float ds, float dm, __m512& w0, __m512& w1) {
    if constexpr (F == Format::kQ4_K) {
        const __m512 table = nibble_values(_mm512_set1_ps(ds), _mm512_set1_ps(dm), true, false);
        const uint8_t* qs = b + 16 + 32 * (s / 2);
        nibble_lookup(qs, 4 * (s % 2), table, w0);
        nibble_lookup(qs + 16, 4 * (s % 2), table, w1);
    } else {
        static_assert(F == Format::kQ5_K, "decode_k: Q4_K or Q5_K");
        // the sub-block's 32 low nibbles and 32 fifth bits are 32 contiguous bytes each: assembled 32 at a time
        const __m256i lows = _mm256_loadu_si256((const __m256i*)(b + 48 + 32 * (s / 2)));
        const __m256i fifths = _mm256_loadu_si256((const __m256i*)(b + 16));
        const __m256i low = _mm256_and_si256(_mm256_srl_epi16(lows, _mm_cvtsi32_si128(4 * (s % 2))),
                                             _mm256_set1_epi8(0x0F));
        const __m256i fifth = _mm256_and_si256(_mm256_srl_epi16(fifths, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
        const __m256i q = _mm256_or_si256(low, _mm256_slli_epi16(fifth, 4));  // bit 0 -> bit 4, within each byte
        const __m512 vds = _mm512_set1_ps(ds), vdm = _mm512_set1_ps(dm);
        w0 = _mm512_sub_ps(_mm512_mul_ps(vds, _mm512_cvtepi32_ps(bytes_to_epi32(_mm256_castsi256_si128(q)))), vdm);
        w1 = _mm512_sub_ps(_mm512_mul_ps(vds, _mm512_cvtepi32_ps(bytes_to_epi32(_mm256_extracti128_si256(q, 1)))),
                           vdm);
    }
}

// Sub-block s (32 values) of a block: w0 = its elements 0-15, w1 = 16-31. The 32-element formats have one
// (their low and high nibbles of the same 16 bytes); the k-quants eight.
template <Format F>
RTP_AVX512 inline void decode(const uint8_t* b, int s, __m512& w0, __m512& w1) {
    if constexpr (has_k_scales(F)) {
        int sc, m;
        quant::k_scale_min(b + 4, s, &sc, &m);
        decode_k<F>(b, s, half_at(b) * static_cast<float>(sc), half_at(b + 2) * static_cast<float>(m), w0, w1);
    } else if constexpr (F == Format::kQ6_K) {
        // A sub-block's 32 low nibbles and 32 high bit pairs are 32 contiguous bytes each: assembled 32 at a time.
        const float d = half_at(b + 208);
        const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
        const int h = s / 4, k = s % 4;
        const __m256i lows = _mm256_loadu_si256((const __m256i*)(b + 64 * h + 32 * (k % 2)));
        const __m256i highs = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
        const __m256i low = _mm256_and_si256(_mm256_srl_epi16(lows, _mm_cvtsi32_si128(4 * (k / 2))),
                                             _mm256_set1_epi8(0x0F));
        const __m256i high =
            _mm256_and_si256(_mm256_srl_epi16(highs, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(0x03));
        // q - 32 in -32..31: a signed byte
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
        w0 = _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(scales[2 * s])),
                           _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
        w1 = _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(scales[2 * s + 1])),
                           _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
    } else if constexpr (F == Format::kQ8_0) {
        const __m512 d = half_lanes(b);
        w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 2)))), d);
        w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 18)))), d);
    } else if constexpr (F == Format::kQ5_0 || F == Format::kQ5_1) {
        // 32 possible weights (a 5-bit q): two 16-entry tables, vpermi2ps on index = low nibble | high bit << 4.
        // Q5_0's d * (q - 16) is exact in float32 (11 x 5 bits), Q5_1's d * q + m rounds as gguf's arithmetic does.
        constexpr bool kMin = F == Format::kQ5_1;
        const __m512 low_q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 d = _mm512_set1_ps(half_at(b));
        __m512 t_low, t_high;
        if constexpr (kMin) {
            const __m512 m = _mm512_set1_ps(half_at(b + 2));
            t_low = _mm512_add_ps(_mm512_mul_ps(d, low_q), m);
            t_high = _mm512_add_ps(_mm512_mul_ps(d, _mm512_add_ps(low_q, _mm512_set1_ps(16))), m);
        } else {
            t_low = _mm512_mul_ps(d, _mm512_sub_ps(low_q, _mm512_set1_ps(16)));
            t_high = _mm512_mul_ps(d, low_q);
        }
        uint32_t qh;
        std::memcpy(&qh, b + 2 + (kMin ? 2 : 0), 4);
        const __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(b + 6 + (kMin ? 2 : 0))));
        const __m512i sixteen = _mm512_set1_epi32(16);
        const __m512i i0 = _mm512_mask_or_epi32(_mm512_and_si512(wide, _mm512_set1_epi32(15)),
                                                static_cast<__mmask16>(qh & 0xFFFF),
                                                _mm512_and_si512(wide, _mm512_set1_epi32(15)), sixteen);
        const __m512i hi = _mm512_srli_epi32(wide, 4);
        const __m512i i1 = _mm512_mask_or_epi32(hi, static_cast<__mmask16>(qh >> 16), hi, sixteen);
        w0 = _mm512_permutex2var_ps(t_low, i0, t_high);
        w1 = _mm512_permutex2var_ps(t_low, i1, t_high);
    } else if constexpr (F == Format::kQ4_0 || F == Format::kQ4_1) {
        constexpr bool kMin = F == Format::kQ4_1;
        const __m512 table = nibble_values(half_lanes(b), kMin ? half_lanes(b + 2) : _mm512_setzero_ps(), false, !kMin);
        const uint8_t* qs = b + (kMin ? 4 : 2);
        nibble_lookup(qs, 0, table, w0);
        nibble_lookup(qs, 4, table, w1);
    } else {
        static_assert(F == Format::kUnknown && F != Format::kUnknown, "a block format without a decoder");
    }
}

// M rows (M <= kDirectRows) against G consecutive weight rows from wj (G independent FMA chains per input row, so
// the FMA latency is hidden even for one row), their blocks decoded in registers. res[r * G + q].
template <Format F, int M, int G>
RTP_AVX512 void direct_rows(const uint8_t* wj, int64_t row_bytes, int64_t block_bytes, const float* x, int64_t k,
                            float* res) {
    constexpr int kSubs = quant::elements(F) / kBlock;
    __m512 acc[M][G];
    for (int r = 0; r < M; ++r)
        for (int q = 0; q < G; ++q) acc[r][q] = _mm512_setzero_ps();
    // The G rows are one contiguous span, and so are the next groups': the span two groups ahead is requested into
    // L2 a block's share per block step. Prefetching a few blocks ahead within each row left the streamed weights
    // at ~12 GB/s (rows are short: 612 bytes for K = 576 in Q4_1), and a step is latency-bound on them.
    // (A prefetch past the span's end only reaches into the next group's rows, or is dropped: never a fault.)
    const int64_t blocks = k / quant::elements(F), span = G * row_bytes;
    const int64_t lines = (span + 63) / 64, per_step = (lines + blocks - 1) / blocks;
    const char* ahead = reinterpret_cast<const char*>(wj) + 2 * span;
    for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t i = 0; i < per_step; ++i) __builtin_prefetch(ahead + 64 * (b * per_step + i), 0, 2);
        for (int sb = 0; sb < kSubs; ++sb) {
            const int64_t at = b * quant::elements(F) + sb * kBlock;
            for (int q = 0; q < G; ++q) {
                __m512 w0, w1;
                decode<F>(wj + q * row_bytes + b * block_bytes, sb, w0, w1);
                for (int r = 0; r < M; ++r) {
                    acc[r][q] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * k + at), acc[r][q]);
                    acc[r][q] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * k + at + 16), acc[r][q]);
                }
            }
        }
    }
    for (int r = 0; r < M; ++r)
        for (int q = 0; q < G; ++q) res[r * G + q] = reduce1(acc[r][q]);
}

template <Format F, int M>
RTP_AVX512 void direct_m(const uint8_t* w, int64_t row_bytes, int64_t block_bytes, const float* x, const float* bias,
                         float* out, int64_t k, int64_t n, int64_t j0, int64_t j1) {
    constexpr int kCols = 4;
    float res[M * kCols];
    auto store = [&](int64_t j, int g) {
        for (int r = 0; r < M; ++r)
            for (int q = 0; q < g; ++q) out[r * n + j + q] = res[r * g + q] + (bias ? bias[j + q] : 0.f);
    };
    int64_t j = j0;
    for (; j + kCols <= j1; j += kCols) {
        direct_rows<F, M, kCols>(w + j * row_bytes, row_bytes, block_bytes, x, k, res);
        store(j, kCols);
    }
    for (; j < j1; ++j) {
        direct_rows<F, M, 1>(w + j * row_bytes, row_bytes, block_bytes, x, k, res);
        store(j, 1);
    }
}

template <Format F>
RTP_AVX512 void direct(const uint8_t* w, int64_t block_bytes, const float* x, const float* bias, float* out,
                       int64_t m, int64_t k, int64_t n, int64_t j0, int64_t j1) {
    const int64_t row_bytes = k / quant::elements(F) * block_bytes;
    switch (m) {
        case 1: return direct_m<F, 1>(w, row_bytes, block_bytes, x, bias, out, k, n, j0, j1);
        case 2: return direct_m<F, 2>(w, row_bytes, block_bytes, x, bias, out, k, n, j0, j1);
        case 3: return direct_m<F, 3>(w, row_bytes, block_bytes, x, bias, out, k, n, j0, j1);
        default: return direct_m<F, 4>(w, row_bytes, block_bytes, x, bias, out, k, n, j0, j1);
    }
}

// R input rows (1 to 3) against the group's kGroup decoded rows over the columns [c0, c1): R x 8 accumulators, all
// in registers (the loop bounds are constants), each weight vector loaded once for the R rows. The accumulators
// start at zero on the first column tile and are parked in `park` between tiles (the lanes still sum the chunks in
// order); the last tile reduces them.
template <int R>
RTP_AVX512 void scratch_rows(const float* scratch, const float* x, int64_t k, int64_t c0, int64_t c1, float* park,
                             bool first, bool last, float res[3][kGroup]) {
    __m512 acc[R][kGroup];
    for (int r = 0; r < R; ++r)
        for (int q = 0; q < kGroup; ++q)
            acc[r][q] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(park + 16 * (r * kGroup + q));
    for (int64_t c = c0; c < c1; c += 16) {
        __m512 xv[R];
        for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(x + r * k + c);
        for (int q = 0; q < kGroup; ++q) {
            __m512 wv = _mm512_loadu_ps(scratch + q * k + c);
            // Kept in a register: otherwise GCC folds the load into each of the R FMAs (R loads per weight vector,
            // and the loop is load-bound), as in gemv_avx512.cc.
            asm("" : "+v"(wv));
            for (int r = 0; r < R; ++r) acc[r][q] = _mm512_fmadd_ps(wv, xv[r], acc[r][q]);
        }
    }
    if (last) {
        for (int r = 0; r < R; ++r) reduce8(acc[r], res[r]);
    } else {
        for (int r = 0; r < R; ++r)
            for (int q = 0; q < kGroup; ++q) _mm512_storeu_ps(park + 16 * (r * kGroup + q), acc[r][q]);
    }
}

// Columns per tile: a group's kGroup decoded rows and three input rows over a tile stay in L1 (48 KiB here) while
// every input row of the block passes; a longer K is cut into tiles, each group's sums parked in between.
constexpr int64_t kTileBytes = 40 * 1024;
// Input rows per block: the block's share of x over a tile stays in L2 while the panel's groups pass.
constexpr int64_t kRowBlock = 96;
static_assert(kRowBlock % 3 == 0, "the parked sums are laid out by triples of rows");

// Weight rows [q0, q1) of a panel (w: its first row) decoded into scratch rows of k floats.
template <Format F>
RTP_AVX512 void decode_rows(const uint8_t* w, int64_t row_bytes, int64_t block_bytes, int64_t k, int64_t q0,
                            int64_t q1, float* scratch) {
    constexpr int kSubs = quant::elements(F) / kBlock;
    const int64_t blocks = k / quant::elements(F);
    for (int64_t q = q0; q < q1; ++q) {
        for (int64_t b = 0; b < blocks; ++b) {
            const uint8_t* block = w + q * row_bytes + b * block_bytes;
            [[maybe_unused]] KScales ks;
            if constexpr (has_k_scales(F)) k_scales(block, ks);
            for (int sb = 0; sb < kSubs; ++sb) {
                __m512 w0, w1;
                if constexpr (has_k_scales(F)) {
                    decode_k<F>(block, sb, ks.ds[sb], ks.dm[sb], w0, w1);
                } else {
                    decode<F>(block, sb, w0, w1);
                }
                float* dst = scratch + q * k + b * quant::elements(F) + sb * kBlock;
                _mm512_storeu_ps(dst, w0);
                _mm512_storeu_ps(dst + 16, w1);
            }
        }
    }
}

template <Format F>
RTP_AVX512 void through_scratch(const uint8_t* w, int64_t block_bytes, const float* x, const float* bias, float* out,
                                int64_t m, int64_t k, int64_t n, int64_t j0, int64_t j1) {
    const int64_t row_bytes = k / quant::elements(F) * block_bytes;
    // as few tiles as fit, of equal width (K 896: one tile, not 832 columns and a short one of 64)
    const int64_t widest = std::max<int64_t>(16, kTileBytes / ((kGroup + 3) * 4) / 16 * 16);
    const int64_t tiles = (k + widest - 1) / widest;
    const int64_t per_tile = ((k + tiles - 1) / tiles + 15) / 16 * 16;
    // a short last group leaves earlier rows in the scratch: their sums are computed and dropped
    std::vector<float> scratch(static_cast<size_t>(kPanel) * k, 0.f);
    std::vector<float> park(tiles > 1 ? static_cast<size_t>(kRowBlock) * kPanel * 16 : 0);
    for (int64_t p = j0; p < j1; p += kPanel) {
        const int64_t cols = std::min<int64_t>(kPanel, j1 - p);
        float res[3][kGroup];
        for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
            const int64_t r1 = std::min(m, r0 + kRowBlock);
            for (int64_t t = 0; t < tiles; ++t) {
                const int64_t c0 = t * per_tile, c1 = std::min(k, c0 + per_tile);
                const bool first = t == 0, last = t == tiles - 1;
                for (int64_t g0 = 0; g0 < cols; g0 += kGroup) {
                    // a group's weight rows, decoded once per panel just before their first pass (so they are in L1
                    // then, not behind the other groups' decoding)
                    if (r0 == 0 && first)
                        decode_rows<F>(w + p * row_bytes, row_bytes, block_bytes, k, g0,
                                       std::min<int64_t>(cols, g0 + kGroup), scratch.data());
                    const float* panel = &scratch[g0 * k];
                    for (int64_t r = r0; r < r1; r += 3) {
                        const int rows = static_cast<int>(std::min<int64_t>(3, r1 - r));
                        // kRowBlock is a multiple of 3: triple (r - r0) / 3, group g0 / kGroup, 3 x kGroup vectors
                        const int64_t triple = (r - r0) / 3, group = g0 / kGroup;
                        float* slot =
                            park.empty() ? nullptr : &park[(triple * (kPanel / kGroup) + group) * 3 * kGroup * 16];
                        if (rows == 3) scratch_rows<3>(panel, x + r * k, k, c0, c1, slot, first, last, res);
                        if (rows == 2) scratch_rows<2>(panel, x + r * k, k, c0, c1, slot, first, last, res);
                        if (rows == 1) scratch_rows<1>(panel, x + r * k, k, c0, c1, slot, first, last, res);
                        if (!last) continue;
                        const int64_t g = std::min<int64_t>(kGroup, cols - g0);
                        for (int rr = 0; rr < rows; ++rr)
                            for (int64_t q = 0; q < g; ++q)
                                out[(r + rr) * n + p + g0 + q] = res[rr][q] + (bias ? bias[p + g0 + q] : 0.f);
                    }
                }
            }
        }
    }
}

template <Format F>
void run(const uint8_t* w, int64_t block_bytes, const float* x, const float* bias, float* out, int64_t m, int64_t k,
         int64_t n) {
    const int64_t panels = (n + kPanel - 1) / kPanel;
    parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
        const int64_t j0 = p0 * kPanel, j1 = std::min(n, p1 * kPanel);
        if (m <= kDirectRows) {
            direct<F>(w, block_bytes, x, bias, out, m, k, n, j0, j1);
        } else {
            through_scratch<F>(w, block_bytes, x, bias, out, m, k, n, j0, j1);
        }
    });
}

}  // namespace

void quant_linear_avx512(int format, const uint8_t* w, int64_t block_bytes, const float* x, const float* bias,
                         float* out, int64_t m, int64_t k, int64_t n) {
    switch (static_cast<Format>(format)) {
        case Format::kQ8_0: return run<Format::kQ8_0>(w, block_bytes, x, bias, out, m, k, n);
        case Format::kQ4_0: return run<Format::kQ4_0>(w, block_bytes, x, bias, out, m, k, n);
        case Format::kQ4_1: return run<Format::kQ4_1>(w, block_bytes, x, bias, out, m, k, n);
        case Format::kQ5_0: return run<Format::kQ5_0>(w, block_bytes, x, bias, out, m, k, n);
        case Format::kQ5_1: return run<Format::kQ5_1>(w, block_bytes, x, bias, out, m, k, n);
        case Format::kQ4_K: return run<Format::kQ4_K>(w, block_bytes, x, bias, out, m, k, n);
        case Format::kQ5_K: return run<Format::kQ5_K>(w, block_bytes, x, bias, out, m, k, n);
        case Format::kQ6_K: return run<Format::kQ6_K>(w, block_bytes, x, bias, out, m, k, n);
        case Format::kUnknown: return;
    }
}

}  // namespace rtp_llm

#endif
