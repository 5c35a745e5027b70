// The panel GEMM on CPUs without AVX-512 (float32) or without avx512_bf16 (bfloat16): the same panels
// (pack_panels, pack_pair_panels), multiplied with 8-lane FMAs.
//
// Why: oneDNN's GEMM and the GEMV kernel choose their blocking and summation by the call's row count, so on
// these CPUs a request's logits depended on what else was in its step. Here, as in panel_linear.cc, each output
// is one FMA chain over k in order from zero, then + bias: float32 gives the AVX-512 kernel's bits, and a row's
// result never depends on the rows beside it, the row blocking or the thread split. bf16 pair steps add the high
// product, then the low one, each rounded once, as vdpbf16ps does (the products of two bf16 are exact in fp32);
// only denormals differ from vdpbf16ps, which flushes them.
//
// Micro-kernels: 6 rows x 16 columns (12 ymm accumulators, 2 panel vectors and a broadcast per k, as BLIS's
// Haswell kernel); one or two rows take the whole 48-column panel per k, so the first pass over a panel reads it as
// one sequential stream (a strip reads 64 of every 192 bytes, a pattern the prefetchers stream poorly). bf16 pairs
// are split into their high and low halves (x once per call, the panel in registers).
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace rtp_llm {

#ifdef __AVX2__
namespace {

// Rows multiplied by one panel before the next: their x rows stay in L2 while every panel passes.
constexpr int64_t kRowChunk = 192;
constexpr int kStripCols = 16;  // a 6-row tile's columns: 12 accumulators, 2 panel vectors, 1 broadcast
constexpr int kTileRows = 6;

// The element kinds. x comes as float32 rows, a bf16 pair split into (high, low) floats: xs[r][2i], xs[r][2i + 1].
// Fp32: a panel row is 48 floats per k. Bf16: 48 pairs per pair step, the high product added before the low one.
struct Fp32Panel {
    using W = float;
    using Out = float;
    static constexpr int kSub = 1;  // products per step and column
    template <int V>
    static __attribute__((always_inline)) inline void load(const W* w, int, __m256 (&wv)[V]) {
        for (int c = 0; c < V; ++c) wv[c] = _mm256_loadu_ps(w + 8 * c);
    }
    static void store(Out* out, __m256 v) { _mm256_storeu_ps(out, v); }
};

struct Bf16Pairs {
    using W = uint32_t;
    using Out = c10::BFloat16;
    static constexpr int kSub = 2;
    template <int V>
    static __attribute__((always_inline)) inline void load(const W* w, int half, __m256 (&wv)[V]) {
        for (int c = 0; c < V; ++c) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8 * c));
            // the high half by two shifts rather than a mask: no register held for the constant
            wv[c] = _mm256_castsi256_ps(half == 0 ? _mm256_slli_epi32(_mm256_srli_epi32(raw, 16), 16)
                                                  : _mm256_slli_epi32(raw, 16));
        }
    }
    static void store(Out* out, __m256 v) { vec::store8(out, v); }  // round to nearest even
};

// Lines of the next panel a tile asks L2 for while it computes from the current one, spread evenly over its k steps
// (the strips compute from L2 and leave the memory bus idle; the next panel's first pass then finds it there).
struct Prefetch {
    const char* at = nullptr;
    int64_t lines = 0;
};

// out[r, 0:cols] = x[r, :] . panel columns [0, 8 V) (+ bias) for MR rows; w: the panel at the tile's first column
// (rows kPanelCols apart), xs: MR float rows of k * kSub values, ldx apart; k: steps (fp32: K; bf16: pairs).
template <typename E, int MR, int V>
void tile(const typename E::W* w, const float* xs, int64_t ldx, int64_t k, const float* bias, typename E::Out* out,
          int64_t ldo, int cols, Prefetch pf = {}) {
    // every loop over rows, columns and halves unrolled in full: otherwise GCC may keep acc in memory
    __m256 acc[MR][V];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < V; ++c) acc[r][c] = _mm256_setzero_ps();
    // k >= 1 (pack_panels takes no empty weight): told to GCC, which otherwise writes acc back to the stack at
    // every step for the case of a loop that never runs
    if (k < 1) __builtin_unreachable();
    const char* ahead = pf.at;
    int64_t due = 0;
    for (int64_t i = 0; i < k; ++i) {
        for (due += pf.lines; due >= k; due -= k, ahead += 64)  // asm: a prefetch builtin stops GCC's store motion
            asm volatile("prefetcht1 (%0)" ::"r"(ahead));
        #pragma GCC unroll 16
        for (int h = 0; h < E::kSub; ++h) {
            if constexpr (MR * V + MR + 1 <= 16) {  // wide tiles: x broadcast first, one panel vector at a time
                __m256 b[MR];
                #pragma GCC unroll 16
                for (int r = 0; r < MR; ++r) b[r] = _mm256_broadcast_ss(xs + r * ldx + i * E::kSub + h);
                #pragma GCC unroll 16
                for (int c = 0; c < V; ++c) {
                    __m256 wv[1];
                    E::template load<1>(w + i * kPanelCols + 8 * c, h, wv);
                    #pragma GCC unroll 16
                    for (int r = 0; r < MR; ++r) acc[r][c] = _mm256_fmadd_ps(wv[0], b[r], acc[r][c]);
                }
            } else {  // tall tiles: the panel vectors first, one x broadcast at a time
                __m256 wv[V];
                E::template load<V>(w + i * kPanelCols, h, wv);
                #pragma GCC unroll 16
                for (int r = 0; r < MR; ++r) {
                    const __m256 b = _mm256_broadcast_ss(xs + r * ldx + i * E::kSub + h);
                    #pragma GCC unroll 16
                    for (int c = 0; c < V; ++c) acc[r][c] = _mm256_fmadd_ps(wv[c], b, acc[r][c]);
                }
            }
        }
    }
    alignas(32) float sums[MR][V * 8];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < V; ++c) _mm256_store_ps(sums[r] + 8 * c, acc[r][c]);
    for (int c = 0; c < V && 8 * c < cols; ++c) {
        const int valid = std::min(8, cols - 8 * c);
        alignas(32) float b[8] = {};
        if (bias) std::memcpy(b, bias + 8 * c, valid * sizeof(float));
        for (int r = 0; r < MR; ++r) {
            const __m256 s = _mm256_load_ps(sums[r] + 8 * c);
            const __m256 v = bias ? _mm256_add_ps(s, _mm256_load_ps(b)) : s;
            typename E::Out* o = out + r * ldo + 8 * c;
            if (valid == 8) {
                E::store(o, v);
            } else {
                typename E::Out tmp[8];
                E::store(tmp, v);
                std::memcpy(o, tmp, valid * sizeof(typename E::Out));
            }
        }
    }
}

template <typename E>
using StripFn = void (*)(const typename E::W*, const float*, int64_t, int64_t, const float*, typename E::Out*,
                         int64_t, int, Prefetch);
template <typename E>
constexpr StripFn<E> kStrips[kTileRows + 1] = {nullptr, &tile<E, 1, 2>, &tile<E, 2, 2>, &tile<E, 3, 2>,
                                               &tile<E, 4, 2>, &tile<E, 5, 2>, &tile<E, 6, 2>};

// Rows [0, rows) of xs by one panel into out's columns [0, cols): one row takes the panel whole (6 accumulator
// chains, one sequential stream); more take it in 16-column strips of 6-row tiles (2 panel loads per 12 FMAs).
template <typename E>
void panel_rows(const typename E::W* pan, const float* xs, int64_t ldx, int64_t k, const float* bias,
                typename E::Out* out, int64_t ldo, int cols, int64_t rows, const char* next, int64_t lines) {
    if (rows == 1) return tile<E, 1, kPanelCols / 8>(pan, xs, ldx, k, bias, out, ldo, cols);
    // the first two rows take the panel whole: one sequential stream from memory, which leaves the panel in L2
    // for the strips
    tile<E, 2, kPanelCols / 8>(pan, xs, ldx, k, bias, out, ldo, cols);
    xs += 2 * ldx;
    out += 2 * ldo;
    rows -= 2;
    if (rows == 0) return;
    // rows split evenly over the fewest tiles: 32 rows as 6,6,5,5,5,5, not 6 x 5 + 2 (a tile under 5 rows waits on
    // FMA latency, so it costs nearly as much as a full one)
    const int64_t tiles = (rows + kTileRows - 1) / kTileRows, base = rows / tiles, extra = rows % tiles;
    const int64_t strips = (cols + kStripCols - 1) / kStripCols;
    if (next == nullptr) lines = 0;
    int64_t given = 0, tile_index = 0;
    for (int c0 = 0; c0 < cols; c0 += kStripCols) {
        const int n = std::min(kStripCols, cols - c0);
        const float* b = bias ? bias + c0 : nullptr;
        for (int64_t t = 0, r = 0; t < tiles; ++t) {
            const int64_t mr = base + (t < extra ? 1 : 0);
            const int64_t upto = lines * ++tile_index / (strips * tiles);
            const Prefetch pf{next + 64 * given, upto - given};
            given = upto;
            kStrips<E>[mr](pan + c0, xs + r * ldx, ldx, k, b, out + r * ldo + c0, ldo, n, pf);
            r += mr;
        }
    }
}

template <typename E>
void panel_gemm(const typename E::W* panels, const float* xs, const float* bias, typename E::Out* out, int64_t m,
                int64_t k, int64_t n) {
    const int64_t np = (n + kPanelCols - 1) / kPanelCols, ldx = k * E::kSub;
    for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, m - r0);
        parallel_for(0, np, 1, [&](int64_t begin, int64_t end) {
            for (int64_t q = begin; q < end; ++q) {
                const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - q * kPanelCols));
                const float* b = bias ? bias + q * kPanelCols : nullptr;
                const int64_t after = q + 1 < end ? q + 1 : parallel_for_next_begin();  // this thread's next panel
                const typename E::W* next = after > q && after < np ? panels + after * k * kPanelCols : nullptr;
                const int64_t lines = k * kPanelCols * static_cast<int64_t>(sizeof(typename E::W)) / 64;
                panel_rows<E>(panels + q * k * kPanelCols, xs + r0 * ldx, ldx, k, b, out + r0 * n + q * kPanelCols, n,
                              cols, rows, reinterpret_cast<const char*>(next), lines);
            }
        });
    }
}

}  // namespace

void panel_linear_fp32_avx2(const float* panels, const float* x, const float* bias, float* out, int64_t m, int64_t k,
                            int64_t n) {
    panel_gemm<Fp32Panel>(panels, x, bias, out, m, k, n);
}

void panel_block_fp32_avx2(const float* panel, const float* x, const float* bias, float* out, int64_t ldo, int64_t k,
                           int cols, int64_t rows, const char* ahead, int64_t lines) {
    panel_rows<Fp32Panel>(panel, x, k, k, bias, out, ldo, cols, rows, ahead, lines);
}

void panel_linear_bf16_avx2(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                            int64_t m, int64_t pairs, int64_t n) {
    // each pair (k = 2i low half, 2i + 1 high half) as two floats, the high one first: the order of the sums
    std::vector<float> xs(static_cast<size_t>(m * pairs * 2));
    for (int64_t j = 0; j < m * pairs; ++j) {
        const uint32_t p = x_pairs[j];
        const uint32_t hi = p & 0xffff0000u, lo = p << 16;
        std::memcpy(&xs[2 * j], &hi, 4);
        std::memcpy(&xs[2 * j + 1], &lo, 4);
    }
    panel_gemm<Bf16Pairs>(panels, xs.data(), bias, out, m, pairs, n);
}

#else  // without AVX2 the planner packs no panels (cpu_isa "scalar")

void panel_linear_fp32_avx2(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) {}
void panel_block_fp32_avx2(const float*, const float*, const float*, float*, int64_t, int64_t, int, int64_t,
                           const char*, int64_t) {}
void panel_linear_bf16_avx2(const uint32_t*, const uint32_t*, const float*, c10::BFloat16*, int64_t, int64_t,
                            int64_t) {}

#endif

}  // namespace rtp_llm
