// The fp32 linear layer on CPUs with AVX-512 (checked at run time; panel_linear_avx2.cc elsewhere, the same sums):
// y = x @ W^T (+ b) on a copy of W packed
// once, at load, into panels of 48 output columns, panel p = W[48p : 48p + 48, :]^T stored k-major
// ([ceil(N / 48), K, 48], the last panel zero-padded), so a panel is one contiguous stream.
//
// Why: decode steps of 17-64 rows are the bulk of a loaded server's work, and there oneDNN's packed GEMM, with
// the weights streamed from memory, stays well below the FMA peak: its weight reads stall the FMAs. Here each
// thread, while it multiplies all rows by one panel (read from memory once, then from L2 for the other row
// blocks), prefetches its next panel into L2, so the compute runs from cache and the memory stream runs beside
// it; at 1-16 rows the panel stream is as fast as the plain-layout GEMV kernel (one contiguous stream per
// panel), so this one kernel and one weight copy serve every row count (benchmarks.cpu_linear --stream).
//
// Micro-kernel: MR <= 8 rows x 48 columns in 24 zmm accumulators; per k, 3 panel vectors and MR broadcasts
// of x. Summation order, per output: one FMA chain over k in order, from zero, then + bias. It does not
// depend on the row count, the row blocking or the thread split, so a sequence's result is the same whatever
// else shares its step (decode, prefill, any batch).
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/panel_tiles.h"
#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/memory/huge_pages.h"

#include <ATen/Parallel.h>


#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace rtp_llm {
namespace panel {
namespace {

thread_local Following t_following;

}  // namespace

Following following_gemm() { return t_following; }

}  // namespace panel

using panel::t_following;
}  // namespace rtp_llm

#if defined(__x86_64__) && defined(__GNUC__)
#include "rtp_llm/cpp/cpu/vec/avx512.h"

namespace rtp_llm {
namespace {

using namespace panel;

constexpr int64_t kMaxBlockRows = 8;

// acc[r][c] += panel row i (48 columns) * x[r, i] for the MR rows.
template <typename E, int MR>
RTP_AVX512_BF16 __attribute__((always_inline)) inline void k_step(const typename E::W* __restrict pan,
                                                                  const typename E::X* __restrict x, int64_t k,
                                                                  int64_t i, __m512 (&acc)[MR][3]) {
    const typename E::W* w = pan + i * kPanelCols;
    const __m512 w0 = E::load(w), w1 = E::load(w + 16), w2 = E::load(w + 32);
    for (int r = 0; r < MR; ++r) {
        const typename E::X xv = x[r * k + i];
        E::step(acc[r][0], w0, xv);
        E::step(acc[r][1], w1, xv);
        E::step(acc[r][2], w2, xv);
    }
}

// out[r, 0:cols] = x[r, :] . panel (+ bias) for MR rows; meanwhile `lines` cache lines from `prefetch` are
// requested into L2, `per_step` per k step, and the next tile's output block (`out_next`, MR rows of 48
// columns at the same stride; null for none) for writing. k: steps (fp32: K; bf16: pairs).
//
// Why the output: a prefill's output (SmolLM2's qkv at 4096 rows: 16 MB) is not in cache, and the 3 x MR
// stores at the end of a tile each wait for their line to be read in (read-for-ownership) with the FMAs
// stopped; requested one line per 4 k steps during the previous tile, they are there (benchmarks/README.md).
//
// Gated (pack_gated_panels: panel columns 0-23 gate, 24-47 up): out[r, j] = silu(gate_j) * up_j for the
// tile's `cols` <= 24 output columns, rounded as activation.cc rounds; from column `exact_from` on (the
// tail activation.cc computes with std::exp, past the last whole 8) the scalar formula.
template <typename E, int MR, bool Gated>
RTP_AVX512_BF16 void tile(const typename E::W* __restrict pan, const typename E::X* __restrict x, int64_t k,
                          const float* bias, typename E::Out* out, int64_t ldo, int cols, const char* prefetch,
                          int64_t lines, int64_t per_step, const typename E::Out* out_next, int exact_from) {
    __m512 acc[MR][3];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < 3; ++c) acc[r][c] = _mm512_setzero_ps();
    // k in steps of 4, the prefetches issued once per step (one loop test per 4 k was measurably faster than
    // one k at a time); the same FMA order either way.
    int64_t next = 0, i = 0, out_line = out_next ? 0 : 3 * MR;
    for (; i + 4 <= k; i += 4) {
        for (int64_t s = 0; s < 4 * per_step && next < lines; ++s, ++next)
            __builtin_prefetch(prefetch + next * 64, 0, 2);
        if (out_line < 3 * MR) {  // row out_line / 3, its 16-column group out_line % 3
            __builtin_prefetch(out_next + (out_line / 3) * ldo + 16 * (out_line % 3), 1, 3);
            ++out_line;
        }
        for (int u = 0; u < 4; ++u) k_step<E, MR>(pan, x, k, i + u, acc);
    }
    for (; i < k; ++i) k_step<E, MR>(pan, x, k, i, acc);
    if constexpr (Gated)
        gated_store<E, MR>(acc, bias, out, ldo, cols, exact_from);
    else
        plain_store<E, MR>(acc, bias, out, ldo, cols);
}

template <typename E>
using TileFn = void (*)(const typename E::W*, const typename E::X*, int64_t, const float*, typename E::Out*,
                        int64_t, int, const char*, int64_t, int64_t, const typename E::Out*, int);
template <typename E, bool G>
constexpr TileFn<E> kTiles[kMaxBlockRows + 1] = {nullptr,           &tile<E, 1, G>, &tile<E, 2, G>,
                                                 &tile<E, 3, G>,    &tile<E, 4, G>, &tile<E, 5, G>,
                                                 &tile<E, 6, G>,    &tile<E, 7, G>, &tile<E, 8, G>};

// Rows x[0, rows) by the panel `pan` into out's columns [0, cols) (row stride ldo; bias at those columns), in
// blocks of at most 8 rows as even as possible (17 rows: 6 + 6 + 5, not 8 + 8 + 1, whose one-row block would be
// load-bound). With several blocks `lines` cache lines from `prefetch` (the next panel) are requested across
// them. One block reads the weights once, as a single sequential stream the hardware prefetcher follows:
// explicit prefetches there only cost (benchmarks.cpu_linear --stream, both cases); `always`: request them even
// then (a decoded panel in cache: the stream is the next panel's blocks, which nothing else reads meanwhile). The
// last block requests `out_last` (the next panel's first output block; null: none) for writing.
template <typename E, bool Gated>
void block_rows(const typename E::W* pan, const typename E::X* x, const float* b, typename E::Out* out, int64_t ldo,
                int64_t k, int cols, int exact_from, int64_t rows, const char* prefetch, int64_t next_lines,
                const typename E::Out* out_last, bool always = false) {
    const int64_t blocks = (rows + kMaxBlockRows - 1) / kMaxBlockRows;
    const int64_t lines_per_block = prefetch && (blocks > 1 || always) ? (next_lines + blocks - 1) / blocks : 0;
    const int64_t per_step = (lines_per_block + k - 1) / k;
    int64_t r = 0, line = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t left = rows - r, mr = (left + (blocks - blk) - 1) / (blocks - blk);
        const int64_t lines = std::min(lines_per_block, next_lines - line);
        const typename E::Out* out_next = blk + 1 < blocks ? out + (r + mr) * ldo : out_last;
        kTiles<E, Gated>[mr](pan, x + r * k, k, b, out + r * ldo, ldo, cols, prefetch + line * 64,
                             std::max<int64_t>(lines, 0), per_step, out_next, exact_from);
        line += std::max<int64_t>(lines, 0);
        r += mr;
    }
}

// Rows [r0, r0 + rows) by panel q; next: the panel whose lines are requested meanwhile, and when next.q >= 0
// the last block requests its first output block (row r0 at its columns). n: output columns (Gated: the
// activation's width).
template <typename E, bool Gated>
void panel_rows(const typename E::W* panels, const typename E::X* x, const float* bias, typename E::Out* out,
                int64_t k, int64_t n, int64_t q, int64_t r0, int64_t rows, NextPanel next) {
    constexpr int64_t oc = kOutCols<Gated>;
    const int cols = static_cast<int>(std::min<int64_t>(oc, n - q * oc));
    // activation.cc's vector loop covers the activation's columns below n rounded down to 8
    const int exact_from = static_cast<int>(std::min<int64_t>(oc, (n & ~int64_t{7}) - q * oc));
    block_rows<E, Gated>(panels + q * k * kPanelCols, x + r0 * k, bias ? bias + q * kPanelCols : nullptr,
                         out + r0 * n + q * oc, n, k, cols, exact_from, rows, next.panel, next.lines,
                         next.q >= 0 ? out + r0 * n + next.q * oc : nullptr);
}

template <typename E, bool Gated = false>
void panel_linear_any(const typename E::W* panels, const typename E::X* x, const float* bias, typename E::Out* out,
                      int64_t m, int64_t k, int64_t n) {
    const int64_t np = (n + kOutCols<Gated> - 1) / kOutCols<Gated>;
    const Following after = following_gemm();  // the caller's: the pool's threads have their own
    for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, m - r0);
        const bool last = r0 + rows >= m;
        // A chunk's last panel requests the first of the chunk this thread will most likely claim next, and a
        // thread's last panel the first it will likely take in the following GEMM: at decode widths (12-128
        // panels in chunks of 1-32) a cold first panel per chunk and per GEMM was a sixth of the panels.
        parallel_for(0, np, 1, [&](int64_t begin, int64_t end) {
            for (int64_t q = begin; q < end; ++q)
                panel_rows<E, Gated>(panels, x, bias, out, k, n, q, r0, rows,
                                     next_panel(panels, k, q, end, last, after));
        });
    }
}

}  // namespace

void panel_linear_avx512(const float* panels, const float* x, const float* bias, float* out, int64_t m, int64_t k,
                         int64_t n) {
    panel_linear_any<Fp32>(panels, x, bias, out, m, k, n);
}

void panel_block_fp32(const float* panel, const float* x, const float* bias, float* out, int64_t ldo, int64_t k,
                      int cols, int64_t rows, const char* prefetch, int64_t lines) {
    block_rows<Fp32, false>(panel, x, bias, out, ldo, k, cols, cols, rows, prefetch, lines, nullptr, true);
}

void panel_block_silu_fp32(const float* panel, const float* x, const float* bias, float* out, int64_t ldo, int64_t k,
                           int cols, int exact_from, int64_t rows, const char* prefetch, int64_t lines) {
    block_rows<Fp32, true>(panel, x, bias, out, ldo, k, cols, exact_from, rows, prefetch, lines, nullptr, true);
}

void panel_block_bf16(const uint32_t* panel, const uint32_t* x_pairs, float* out, int64_t ldo, int64_t pairs,
                      int cols, int64_t rows, const char* prefetch, int64_t lines) {
    block_rows<Bf16PairsFloatOut, false>(panel, x_pairs, nullptr, out, ldo, pairs, cols, cols, rows, prefetch, lines,
                                         nullptr, true);
}

void panel_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                       int64_t m, int64_t pairs, int64_t n) {
    if (panel::amx_panels(pairs))
        panel::amx_linear_bf16(panels, x_pairs, bias, out, m, pairs, n);
    else
        panel_linear_any<Bf16Pairs>(panels, x_pairs, bias, out, m, pairs, n);
}

void panel_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, float* out, int64_t m,
                       int64_t pairs, int64_t n) {
    if (panel::amx_panels(pairs) && bias == nullptr)
        panel::amx_linear_bf16(panels, x_pairs, out, m, pairs, n);
    else
        panel_linear_any<Bf16PairsFloatOut>(panels, x_pairs, bias, out, m, pairs, n);
}

void panel_linear_silu_fp32(const float* panels, const float* x, const float* bias, float* out, int64_t m,
                            int64_t k, int64_t inter) {
    panel_linear_any<Fp32, true>(panels, x, bias, out, m, k, inter);
}

void panel_linear_silu_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                            int64_t m, int64_t pairs, int64_t inter) {
    if (panel::amx_panels(pairs))
        panel::amx_linear_silu_bf16(panels, x_pairs, bias, out, m, pairs, inter);
    else
        panel_linear_any<Bf16Pairs, true>(panels, x_pairs, bias, out, m, pairs, inter);
}

}  // namespace rtp_llm

#else

namespace rtp_llm {
void panel_linear_avx512(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) {}
void panel_block_fp32(const float*, const float*, const float*, float*, int64_t, int64_t, int, int64_t, const char*,
                      int64_t) {}
void panel_block_silu_fp32(const float*, const float*, const float*, float*, int64_t, int64_t, int, int, int64_t,
                           const char*, int64_t) {}
void panel_block_bf16(const uint32_t*, const uint32_t*, float*, int64_t, int64_t, int, int64_t, const char*, int64_t) {}
void panel_linear_bf16(const uint32_t*, const uint32_t*, const float*, c10::BFloat16*, int64_t, int64_t, int64_t) {}
void panel_linear_bf16(const uint32_t*, const uint32_t*, const float*, float*, int64_t, int64_t, int64_t) {}
void panel_linear_silu_fp32(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) {}
void panel_linear_silu_bf16(const uint32_t*, const uint32_t*, const float*, c10::BFloat16*, int64_t, int64_t,
                            int64_t) {}
}  // namespace rtp_llm

#endif

namespace rtp_llm {

at::Tensor pack_pair_panels(const at::Tensor& w) {
    TORCH_CHECK(w.device().is_cpu() && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16) &&
                    w.dim() == 2 && w.numel() > 0,
                "pack_pair_panels: w must be a non-empty float32 or bfloat16 [N, K] CPU tensor");
    const int64_t n = w.size(0), k = w.size(1), pairs = (k + 1) / 2, np = (n + kPanelCols - 1) / kPanelCols;
    // [np * 48, 2 * pairs] bf16 zero-padded (float32 rounded to nearest even), then each panel's [48, pairs]
    // block of 32-bit pairs transposed to [pairs, 48], on 2 MB pages.
    auto padded = at::zeros({np * kPanelCols, 2 * pairs}, w.options().dtype(at::kBFloat16));
    padded.narrow(0, 0, n).narrow(1, 0, k).copy_(w);
    auto panels = huge_page_empty({np, pairs, kPanelCols}, at::kInt);
    panels.copy_(padded.view(at::kInt).view({np, kPanelCols, pairs}).transpose(1, 2));
    return panels;
}

at::Tensor pack_panels(const at::Tensor& w) {
    if (w.scalar_type() == at::kBFloat16) return pack_pair_panels(w);
    TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.numel() > 0,
                "pack_panels: w must be a non-empty float32 or bfloat16 [N, K] CPU tensor");
    const int64_t n = w.size(0), k = w.size(1), np = (n + kPanelCols - 1) / kPanelCols;
    // [np * 48, K] zero-padded, then each panel's [48, K] block transposed to [K, 48], on 2 MB pages (the
    // panels are streamed at every step).
    auto padded = at::zeros({np * kPanelCols, k}, w.options());
    padded.narrow(0, 0, n).copy_(w);
    auto panels = huge_page_empty({np, k, kPanelCols}, at::kFloat);
    panels.copy_(padded.view({np, kPanelCols, k}).transpose(1, 2));
    return panels;
}

namespace {

// x checked against the panels' element kind and made ready for the kernels: contiguous, and for bf16 pair
// panels a whole number of pairs per row (an odd K zero-padded). steps: the kernels' k (fp32: K; bf16: pairs).
struct PanelInput {
    bool bf16;
    int64_t k, steps;
    at::Tensor x;
};

PanelInput panel_input(const at::Tensor& x, const at::Tensor& panels, const char* op) {
    TORCH_CHECK(cpu_isa() != "scalar", op, ": needs a CPU with AVX2 (see cpu_isa)");
    const bool bf16 = panels.scalar_type() == at::kInt;
    TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == (bf16 ? at::kBFloat16 : at::kFloat), op,
                ": x must be a [M, K] CPU tensor in the weight's dtype (float32 panels: float32, bfloat16 pair "
                "panels: bfloat16)");
    const int64_t k = x.size(1);
    at::Tensor xc = x.contiguous();
    if (bf16 && k % 2) xc = at::constant_pad_nd(xc, {0, 1});
    return {bf16, k, bf16 ? (k + 1) / 2 : k, xc};
}

}  // namespace

PanelsAfter::PanelsAfter(const std::optional<at::Tensor>& panels)
    : saved_base_(t_following.base), saved_bytes_(t_following.panel_bytes), saved_panels_(t_following.panels) {
    t_following = {};
    if (panels.has_value() && panels->defined() && panels->dim() == 3 && panels->size(2) == kPanelCols &&
        (panels->scalar_type() == at::kFloat || panels->scalar_type() == at::kInt))
        t_following = {static_cast<const char*>(panels->data_ptr()), panels->stride(0) * 4, panels->size(0)};
}

PanelsAfter::~PanelsAfter() {
    t_following = {saved_base_, saved_bytes_, saved_panels_};
}

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                        int64_t n) {
    auto out = at::empty({x.size(0), n}, x.options());
    panel_linear_out(x, panels, bias, n, out);
    return out;
}

void panel_linear_out(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias, int64_t n,
                      at::Tensor& out) {
    const auto [bf16, k, steps, xc] = panel_input(x, panels, "panel_linear");
    TORCH_CHECK((panels.scalar_type() == at::kFloat || bf16) && panels.dim() == 3 && panels.size(2) == kPanelCols &&
                    panels.is_contiguous(),
                "panel_linear: panels must be pack_panels' contiguous [ceil(N / 48), K (bf16: K / 2 pairs), 48]");
    TORCH_CHECK(panels.size(1) == steps, "panel_linear: x has ", k, " columns, the weight ",
                bf16 ? 2 * panels.size(1) : panels.size(1));
    TORCH_CHECK(n > (panels.size(0) - 1) * kPanelCols && n <= panels.size(0) * kPanelCols, "panel_linear: n = ", n,
                " does not match ", panels.size(0), " panels");
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "panel_linear: bias must be [", n, "]");
        b = bias->to(at::kFloat).contiguous();
    }
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == n &&
                    out.scalar_type() == x.scalar_type(),
                "panel_linear: out must be a contiguous [", x.size(0), ", ", n, "] tensor in x's dtype");
    if (x.size(0) == 0) return;
    if (bf16) {  // x's rows as 32-bit pairs
        const auto* pp = reinterpret_cast<const uint32_t*>(panels.data_ptr<int32_t>());
        const auto* xp = reinterpret_cast<const uint32_t*>(xc.data_ptr<at::BFloat16>());
        if (cpu_avx512_bf16())
            panel_linear_bf16(pp, xp, bp, out.data_ptr<at::BFloat16>(), x.size(0), steps, n);
        else
            panel_linear_bf16_avx2(pp, xp, bp, out.data_ptr<at::BFloat16>(), x.size(0), steps, n);
    } else if (cpu_avx512()) {
        panel_linear_avx512(panels.data_ptr<float>(), xc.data_ptr<float>(), bp, out.data_ptr<float>(), x.size(0), k,
                            n);
    } else {
        panel_linear_fp32_avx2(panels.data_ptr<float>(), xc.data_ptr<float>(), bp, out.data_ptr<float>(), x.size(0),
                               k, n);
    }
}

at::Tensor pack_gated_panels(const at::Tensor& w) {
    TORCH_CHECK(w.device().is_cpu() && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16) &&
                    w.dim() == 2 && w.numel() > 0 && w.size(0) % 2 == 0,
                "pack_gated_panels: w must be a non-empty float32 or bfloat16 [2 x intermediate, K] CPU tensor "
                "([gate; up])");
    constexpr int64_t half = kPanelCols / 2;
    const int64_t inter = w.size(0) / 2, np = (inter + half - 1) / half, k = w.size(1);
    // [gate; up], each zero-padded to np x 24 rows, interleaved per 24 rows: [gate 0-23, up 0-23, gate 24-47, ...]
    auto padded = at::zeros({2, np * half, k}, w.options());
    padded.narrow(1, 0, inter).copy_(w.view({2, inter, k}));
    return pack_panels(padded.view({2, np, half, k}).transpose(0, 1).reshape({2 * np * half, k}));
}

at::Tensor gated_bias(const std::optional<at::Tensor>& bias, int64_t inter, const char* op) {
    if (!bias.has_value() || !bias->defined()) return {};
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == 2 * inter, op, ": bias must be [", 2 * inter, "] ([gate; up])");
    constexpr int64_t half = kPanelCols / 2;
    const int64_t np = (inter + half - 1) / half;
    auto padded = at::zeros({2, np * half}, bias->options().dtype(at::kFloat));
    padded.narrow(1, 0, inter).copy_(bias->view({2, inter}));
    return padded.view({2, np, half}).transpose(0, 1).contiguous().view({-1});
}

at::Tensor panel_linear_silu(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                             int64_t inter) {
    const auto [bf16, k, steps, xc] = panel_input(x, panels, "panel_linear_silu");
    TORCH_CHECK(bf16 ? cpu_avx512_bf16() : cpu_avx512(), "panel_linear_silu: gated panels need a CPU with AVX-512",
                bf16 ? " and avx512_bf16" : "", " (elsewhere gate_up keeps plain panels)");
    constexpr int64_t half = kPanelCols / 2;
    const int64_t np = (inter + half - 1) / half;
    TORCH_CHECK(inter > 0 && (panels.scalar_type() == at::kFloat || bf16) && panels.dim() == 3 &&
                    panels.size(0) == np && panels.size(1) == steps && panels.size(2) == kPanelCols &&
                    panels.is_contiguous(),
                "panel_linear_silu: panels must be pack_gated_panels' [", np, ", ", steps, ", 48] for intermediate ",
                inter, " and x's ", k, " columns, got ", panels.sizes());
    const at::Tensor b = gated_bias(bias, inter, "panel_linear_silu");
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    auto out = at::empty({x.size(0), inter}, x.options());
    if (x.size(0) == 0) return out;
    if (bf16) {
        panel_linear_silu_bf16(reinterpret_cast<const uint32_t*>(panels.data_ptr<int32_t>()),
                               reinterpret_cast<const uint32_t*>(xc.data_ptr<at::BFloat16>()), bp,
                               out.data_ptr<at::BFloat16>(), x.size(0), steps, inter);
    } else {
        panel_linear_silu_fp32(panels.data_ptr<float>(), xc.data_ptr<float>(), bp, out.data_ptr<float>(), x.size(0),
                               k, inter);
    }
    return out;
}

}  // namespace rtp_llm
