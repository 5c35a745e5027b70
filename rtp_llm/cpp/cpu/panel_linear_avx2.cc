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
// Micro-kernel: 2 rows x 48 columns (fp32: 12 ymm accumulators) or 2 rows x 24 columns (bf16: 6 accumulators,
// the pair split into its two halves in registers), per k one panel row and one broadcast per row.
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

#include <algorithm>
#include <cstring>

namespace rtp_llm {

#ifdef __AVX2__
namespace {

// Rows multiplied by one panel before the next: their x rows stay in L2 while every panel passes.
constexpr int64_t kRowChunk = 192;

struct Fp32Panel {
    using W = float;
    using X = float;
    using Out = float;
    static constexpr int kVecs = 6;  // 48 columns per tile
    template <int MR>
    static __attribute__((always_inline)) inline void step(const W* w, const X* x, int64_t ldx, int64_t i,
                                                           __m256 (&acc)[MR][kVecs]) {
        __m256 xb[MR];
        for (int r = 0; r < MR; ++r) xb[r] = _mm256_broadcast_ss(x + r * ldx + i);
        for (int c = 0; c < kVecs; ++c) {
            const __m256 wv = _mm256_loadu_ps(w + 8 * c);
            for (int r = 0; r < MR; ++r) acc[r][c] = _mm256_fmadd_ps(wv, xb[r], acc[r][c]);
        }
    }
    static void store(Out* out, __m256 v) { _mm256_storeu_ps(out, v); }
};

struct Bf16Pairs {
    using W = uint32_t;
    using X = uint32_t;
    using Out = c10::BFloat16;
    static constexpr int kVecs = 3;  // 24 columns per tile
    template <int MR>
    static __attribute__((always_inline)) inline void step(const W* w, const X* x, int64_t ldx, int64_t i,
                                                           __m256 (&acc)[MR][kVecs]) {
        __m256 hi[MR], lo[MR];
        for (int r = 0; r < MR; ++r) {
            const uint32_t p = x[r * ldx + i];
            hi[r] = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(p & 0xffff0000u)));
            lo[r] = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(p << 16)));
        }
        const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
        for (int c = 0; c < kVecs; ++c) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8 * c));
            const __m256 wh = _mm256_castsi256_ps(_mm256_and_si256(raw, mask));
            const __m256 wl = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
            for (int r = 0; r < MR; ++r) {
                acc[r][c] = _mm256_fmadd_ps(wh, hi[r], acc[r][c]);
                acc[r][c] = _mm256_fmadd_ps(wl, lo[r], acc[r][c]);
            }
        }
    }
    static void store(Out* out, __m256 v) { vec::store8(out, v); }  // round to nearest even
};

// out[r, 0:cols] = x[r, :] . panel columns [0, 8 kVecs) (+ bias) for MR rows; w: the panel at the tile's first
// column, rows kPanelCols apart; k: steps (fp32: K; bf16: pairs).
template <typename E, int MR>
void tile(const typename E::W* w, const typename E::X* x, int64_t k, const float* bias, typename E::Out* out,
          int64_t ldo, int cols) {
    constexpr int V = E::kVecs;
    __m256 acc[MR][V];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < V; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; ++i) E::template step<MR>(w + i * kPanelCols, x, k, i, acc);
    for (int c = 0; c < V && 8 * c < cols; ++c) {
        const int valid = std::min(8, cols - 8 * c);
        alignas(32) float b[8] = {};
        if (bias) std::memcpy(b, bias + 8 * c, valid * sizeof(float));
        for (int r = 0; r < MR; ++r) {
            const __m256 v = bias ? _mm256_add_ps(acc[r][c], _mm256_load_ps(b)) : acc[r][c];
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
void panel_gemm(const typename E::W* panels, const typename E::X* x, const float* bias, typename E::Out* out,
                int64_t m, int64_t k, int64_t n) {
    constexpr int64_t tile_cols = 8 * E::kVecs;
    const int64_t np = (n + kPanelCols - 1) / kPanelCols;
    for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, m - r0);
        parallel_for(0, np, 1, [&](int64_t begin, int64_t end) {
            for (int64_t q = begin; q < end; ++q) {
                for (int64_t c0 = 0; c0 < kPanelCols && q * kPanelCols + c0 < n; c0 += tile_cols) {
                    const int64_t col = q * kPanelCols + c0;
                    const int cols = static_cast<int>(std::min(tile_cols, n - col));
                    const typename E::W* w = panels + q * k * kPanelCols + c0;
                    const float* b = bias ? bias + col : nullptr;
                    int64_t r = r0;
                    for (; r + 2 <= r0 + rows; r += 2) tile<E, 2>(w, x + r * k, k, b, out + r * n + col, n, cols);
                    if (r < r0 + rows) tile<E, 1>(w, x + r * k, k, b, out + r * n + col, n, cols);
                }
            }
        });
    }
}

}  // namespace

void panel_linear_fp32_avx2(const float* panels, const float* x, const float* bias, float* out, int64_t m, int64_t k,
                            int64_t n) {
    panel_gemm<Fp32Panel>(panels, x, bias, out, m, k, n);
}

void panel_linear_bf16_avx2(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                            int64_t m, int64_t pairs, int64_t n) {
    panel_gemm<Bf16Pairs>(panels, x_pairs, bias, out, m, pairs, n);
}

#else  // without AVX2 the planner packs no panels (cpu_isa "scalar")

void panel_linear_fp32_avx2(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) {}
void panel_linear_bf16_avx2(const uint32_t*, const uint32_t*, const float*, c10::BFloat16*, int64_t, int64_t,
                            int64_t) {}

#endif

}  // namespace rtp_llm
