// What the panel kernels share (panel_linear.cc: the FMA and vdpbf16ps tiles; panel_linear_amx.cc: AMX tiles):
// the element kinds, the epilogues that store a tile (bias, rounding, the gated SiLU), and the choice of the panel
// whose lines a thread requests while it multiplies the current one.
#pragma once

#include <cstdint>
#include <vector>

#include "rtp_llm/cpp/cpu/ops.h"

namespace rtp_llm {
namespace panel {

// The GEMM that follows this thread's panel GEMMs (PanelsAfter): its panels' base, bytes per panel, count.
struct Following {
    const char* base = nullptr;
    int64_t panel_bytes = 0, panels = 0;
};
// This thread's (PanelsAfter's) following GEMM.
Following following_gemm();

// Rows multiplied by one panel before the next: their x rows (192 x K floats) stay in L2 while every panel
// passes, instead of all of a 4096-row prefill's x being re-read from L3 per panel. (Between 48 and 384 rows the
// chunk made no measurable difference; wide outputs such as gate_up at 4096 rows stay slower than the other
// shapes, which is why CpuOps.mlp splits a prefill's rows.)
constexpr int64_t kRowChunk = 192;

// bf16 GEMMs on AMX tiles (panel_linear_amx.cc): whether one of `pairs` pair steps runs there (the CPU and K
// alone decide, never a call's rows), and panel_linear_bf16 / panel_linear_silu_bf16 there.
bool amx_panels(int64_t pairs);
void amx_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                     int64_t m, int64_t pairs, int64_t n);
void amx_linear_silu_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                          int64_t m, int64_t pairs, int64_t inter);
// The same products in float32 (greedy_head's screen of a float32 head).
void amx_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, float* out, int64_t m, int64_t pairs, int64_t n);

// Rows of x (bf16 pair steps, amx_panels(pairs)) against pair panels on AMX tiles, on the thread that makes it: it
// configures the thread's tiles for the rows (up to 16: m rows; more: 16-row tiles, the rows after the last whole
// 16 copied into zero-padded ones) and releases them when it goes. For panels made while the thread runs, such as
// a quantized head's decoded panels (quant_linear_avx512.cc's screen).
class AmxRows {
  public:
    AmxRows(const uint32_t* x_pairs, int64_t m, int64_t pairs);
    ~AmxRows();
    AmxRows(const AmxRows&) = delete;
    AmxRows& operator=(const AmxRows&) = delete;
    // The fp32 sums of rows [r, r + rows) (r a multiple of 32, rows <= 32; up to 16 rows: r 0 and all m rows) by
    // the panel `pan` ([pairs, 48] pairs) into cbuf [rows, 48]; `lines` cache lines from `prefetch` requested
    // meanwhile.
    void sums(const uint32_t* pan, int64_t r, int64_t rows, const char* prefetch, int64_t lines, float* cbuf) const;
    // Rows [r0, r0 + rows) (r0 a multiple of 32) by the panel, their first `cols` sums stored as floats in out's
    // rows (ldo apart).
    void store_panel(const uint32_t* pan, int64_t r0, int64_t rows, float* out, int64_t ldo, int cols,
                     const char* prefetch, int64_t lines) const;

  private:
    const uint32_t* x_;
    int64_t m_, pairs_, whole_;  // whole_: the rows in whole 16-row tiles (all m up to 16)
    std::vector<uint32_t> tail_;
};

}  // namespace panel
}  // namespace rtp_llm

#if defined(__x86_64__) && defined(__GNUC__)
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "rtp_llm/cpp/cpu/vec/avx512.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

namespace rtp_llm {
namespace panel {

// The two element kinds. Fp32: a panel row is 48 floats per k, x a float per k, one FMA per product. Bf16:
// a panel row is 48 pairs of bf16 (k = 2i low half, 2i + 1 high half) per pair step i, x a pair of bf16 per
// step, vdpbf16ps adds both exact products to the fp32 accumulator (high then low, each rounded once).
struct Fp32 {
    using W = float;
    using X = float;
    using Out = float;
    RTP_AVX512 static __attribute__((always_inline)) inline void step(__m512& acc, __m512 w, X x) {
        acc = _mm512_fmadd_ps(w, _mm512_set1_ps(x), acc);
    }
    RTP_AVX512 static __attribute__((always_inline)) inline __m512 load(const W* p) { return _mm512_loadu_ps(p); }
    RTP_AVX512 static inline void store(Out* out, __mmask16 mask, __m512 v) { _mm512_mask_storeu_ps(out, mask, v); }
};

struct Bf16Pairs {
    using W = uint32_t;
    using X = uint32_t;
    using Out = c10::BFloat16;
    RTP_AVX512_BF16 static __attribute__((always_inline)) inline void step(__m512& acc, __m512 w, X x) {
        acc = _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_set1_epi32(static_cast<int>(x)));
    }
    RTP_AVX512_BF16 static __attribute__((always_inline)) inline __m512 load(const W* p) {
        return _mm512_castsi512_ps(_mm512_loadu_si512(p));
    }
    // Round to nearest even, as c10::BFloat16 does (the instruction also flushes denormals to zero).
    RTP_AVX512_BF16 static inline void store(Out* out, __mmask16 mask, __m512 v) {
        _mm256_mask_storeu_epi16(out, mask, (__m256i)_mm512_cvtneps_pbh(v));
    }
};

// The SiLU-gated epilogue (tile with Gated) rounds where activation.cc's inputs and outputs were rounded
// when gate_up and the activation were separate kernels, so that fusing them changes no bit:
// as_stored: gate_up's value as the store above leaves it; round_act / store_act: silu_and_mul's rounding of
// silu(gate) before the product and of the product (bf16: round to nearest even on the bits, as
// vec::store8 does, denormals kept).

struct Fp32Act {
    RTP_AVX512 static inline __m512 as_stored(__m512 v) { return v; }
    RTP_AVX512 static inline __m512 round_act(__m512 v) { return v; }
    RTP_AVX512 static inline void store_act(float* out, __mmask16 mask, __m512 v) {
        _mm512_mask_storeu_ps(out, mask, v);
    }
};

struct Bf16Act {
    RTP_AVX512_BF16 static inline __m512 as_stored(__m512 v) {
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    RTP_AVX512 static inline __m512 round_act(__m512 v) { return _mm512_castsi512_ps(avx512::bf16_rne_bits(v)); }
    RTP_AVX512 static inline void store_act(c10::BFloat16* out, __mmask16 mask, __m512 v) {
        _mm256_mask_storeu_epi16(out, mask, _mm512_cvtepi32_epi16(_mm512_srli_epi32(avx512::bf16_rne_bits(v), 16)));
    }
};

template <typename Out>
using ActOf = std::conditional_t<std::is_same_v<Out, float>, Fp32Act, Bf16Act>;

// The same products kept in float32 (the greedy head's screen needs its values unrounded).
struct Bf16PairsFloatOut : Bf16Pairs {
    using Out = float;
    RTP_AVX512_BF16 static inline void store(Out* out, __mmask16 mask, __m512 v) { _mm512_mask_storeu_ps(out, mask, v); }
};
// The Gated epilogue of tile(): lanes of acc[r] = panel columns 0-15 | 16-31 | 32-47, gate = columns 0-23,
// up = 24-47. x / (1 + exp(-x)) with exp16, the formula and exp of activation.cc's vector loop.
template <typename E, int MR>
RTP_AVX512_BF16 __attribute__((always_inline)) inline void gated_store(__m512 (&acc)[MR][3], const float* bias,
                                                                      typename E::Out* out, int64_t ldo, int cols,
                                                                      int exact_from) {
    using Act = ActOf<typename E::Out>;
    const __m512i up_lo_idx = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512 one = _mm512_set1_ps(1.f);
    const __mmask16 mask_lo = static_cast<__mmask16>(cols >= 16 ? 0xffff : (1u << std::max(cols, 0)) - 1);
    const __mmask16 mask_hi = static_cast<__mmask16>(cols > 16 ? (1u << (cols - 16)) - 1 : 0);
    for (int r = 0; r < MR; ++r) {
        __m512 v[3];
        for (int c = 0; c < 3; ++c)
            v[c] = Act::as_stored(bias ? _mm512_add_ps(acc[r][c], _mm512_loadu_ps(bias + 16 * c)) : acc[r][c]);
        // gate 0-15 | up 0-15, and gate 16-23 | up 16-23 in the low 8 lanes
        const __m512 g_lo = v[0], u_lo = _mm512_permutex2var_ps(v[1], up_lo_idx, v[2]);
        const __m512 g_hi = v[1], u_hi = _mm512_shuffle_f32x4(v[2], v[2], 0xee);
        typename E::Out* o = out + r * ldo;
        for (int h = 0; h < 2; ++h) {
            const __m512 g = h ? g_hi : g_lo, u = h ? u_hi : u_lo;
            const __m512 e = avx512::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
            const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
            Act::store_act(o + 16 * h, h ? mask_hi : mask_lo, _mm512_mul_ps(Act::round_act(silu), u));
        }
        if (exact_from < cols) {  // activation.cc's scalar tail
            alignas(64) float g[32], u[32];
            _mm512_store_ps(g, g_lo), _mm512_store_ps(g + 16, g_hi);
            _mm512_store_ps(u, u_lo), _mm512_store_ps(u + 16, u_hi);
            using T = typename E::Out;
            for (int j = std::max(exact_from, 0); j < cols; ++j)
                o[j] = static_cast<T>(vec::round_as<T>(g[j] / (1.f + std::exp(-g[j]))) * u[j]);
        }
    }
}

// The plain epilogue of tile(): acc (+ bias) into out's columns [0, cols) of MR rows.
template <typename E, int MR>
RTP_AVX512_BF16 __attribute__((always_inline)) inline void plain_store(__m512 (&acc)[MR][3], const float* bias,
                                                                      typename E::Out* out, int64_t ldo, int cols) {
    for (int c = 0; c < 3; ++c) {
        const int valid = std::clamp(cols - 16 * c, 0, 16);
        if (valid == 0) break;
        const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * c) : _mm512_setzero_ps();
        for (int r = 0; r < MR; ++r)
            E::store(out + r * ldo + 16 * c, mask, bias ? _mm512_add_ps(acc[r][c], b) : acc[r][c]);
    }
}
// Output columns per panel: 48, or 24 activations of a gated panel.
template <bool Gated>
constexpr int64_t kOutCols = Gated ? kPanelCols / 2 : kPanelCols;

// The panel a thread multiplies after the current one, whose lines it requests meanwhile: the next in its
// chunk, the first of the chunk it will likely claim next, or of the GEMM that follows (q -1: its output
// block is unknown). panel null: none.
struct NextPanel {
    const char* panel = nullptr;
    int64_t lines = 0, q = -1;
};
// The panel after q in this thread's chunk [.., end), else the first of the chunk it will likely claim next, else
// (the call's last row chunk) the first it will likely take in the GEMM that follows.
template <typename W>
NextPanel next_panel(const W* panels, int64_t k, int64_t q, int64_t end, bool last, const Following& after) {
    const int64_t nq = q + 1 < end ? q + 1 : parallel_for_next_begin();
    if (nq >= 0) return {reinterpret_cast<const char*>(panels + nq * k * kPanelCols), k * kPanelCols * 4 / 64, nq};
    if (last && after.base) {
        const int64_t fq = parallel_for_first_begin(after.panels, 1);
        if (fq >= 0) return {after.base + fq * after.panel_bytes, after.panel_bytes / 64, -1};
    }
    return {};
}
}  // namespace panel
}  // namespace rtp_llm

#endif
