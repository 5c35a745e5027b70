// The fp32 linear layer on CPUs with AVX-512 (checked at run time): y = x @ W^T (+ b) on a copy of W packed
// once, at load, into panels of 48 output columns, panel p = W[48p : 48p + 48, :]^T stored k-major
// ([ceil(N / 48), K, 48], the last panel zero-padded), so a panel is one contiguous stream.
//
// Why: decode steps of 17-64 rows are the bulk of a loaded server's work, and there oneDNN's packed GEMM
// reached ~150-160 GFLOP/s with SmolLM2's weights streamed from memory (the machine's FMA peak is ~230): its
// weight reads stall the FMAs. Here each thread, while it multiplies all rows by one panel (read from
// memory once, then from L2 for the other row blocks), prefetches its next panel into L2, so the compute runs
// from cache and the memory stream runs beside it. benchmarks/cpu_linear.py --stream: 30 SmolLM2 layers at
// 32 rows ~35 ms vs oneDNN ~43; and at 1-16 rows the panel stream is as fast as the plain-layout GEMV kernel
// (one contiguous stream per panel), so this one kernel and one weight copy serve every row count.
//
// Micro-kernel: MR <= 8 rows x 48 columns in 24 zmm accumulators; per k, 3 panel vectors and MR broadcasts
// of x. Summation order, per output: one FMA chain over k in order, from zero, then + bias. It does not
// depend on the row count, the row blocking or the thread split, so a sequence's result is the same whatever
// else shares its step (decode, prefill, any batch).
#include "rtp_llm/cpp/ops/panel_linear.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include "rtp_llm/cpp/ops/cpu_kernels.h"
#include "rtp_llm/cpp/ops/gemv_avx512.h"

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__)
#include "rtp_llm/cpp/ops/avx512_vec.h"

namespace rtp_llm {
namespace {

constexpr int64_t kMaxBlockRows = 8;
// Rows multiplied by one panel before the next: their x rows (192 x K floats) stay in L2 while every panel
// passes, instead of all of a 4096-row prefill's x being re-read from L3 per panel. (Between 48 and 384 rows
// the chunk made no measurable difference here; wide outputs such as gate_up at 4096 rows stay slower,
// ~163 GFLOP/s against ~205-217 for qkv/o/down, which is why CpuOps.mlp splits a prefill's rows.)
constexpr int64_t kRowChunk = 192;

// acc[r][c] += panel row i (48 columns) * x[r, i] for the MR rows.
template <int MR>
RTP_AVX512 __attribute__((always_inline)) inline void k_step(const float* __restrict pan, const float* __restrict x,
                                                             int64_t k, int64_t i, __m512 (&acc)[MR][3]) {
    const float* w = pan + i * kPanelCols;
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
    for (int r = 0; r < MR; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * k + i]);
        acc[r][0] = _mm512_fmadd_ps(w0, xb, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(w1, xb, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(w2, xb, acc[r][2]);
    }
}

// out[r, 0:cols] = x[r, :] . panel (+ bias) for MR rows; meanwhile `lines` cache lines from `prefetch` are
// requested into L2, `per_step` per k.
template <int MR>
RTP_AVX512 void tile(const float* __restrict pan, const float* __restrict x, int64_t k, const float* bias,
                     float* out, int64_t ldo, int cols, const char* prefetch, int64_t lines, int64_t per_step) {
    __m512 acc[MR][3];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < 3; ++c) acc[r][c] = _mm512_setzero_ps();
    // k in steps of 4, the prefetches issued once per step (one loop test per 4 k: 30 layers at 32 rows
    // ~198 vs ~185 GFLOP/s one k at a time); the same FMA order either way.
    int64_t next = 0, i = 0;
    for (; i + 4 <= k; i += 4) {
        for (int64_t s = 0; s < 4 * per_step && next < lines; ++s, ++next)
            __builtin_prefetch(prefetch + next * 64, 0, 2);
        for (int u = 0; u < 4; ++u) k_step<MR>(pan, x, k, i + u, acc);
    }
    for (; i < k; ++i) k_step<MR>(pan, x, k, i, acc);
    for (int c = 0; c < 3; ++c) {
        const int valid = std::clamp(cols - 16 * c, 0, 16);
        if (valid == 0) break;
        const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * c) : _mm512_setzero_ps();
        for (int r = 0; r < MR; ++r)
            _mm512_mask_storeu_ps(out + r * ldo + 16 * c, mask, bias ? _mm512_add_ps(acc[r][c], b) : acc[r][c]);
    }
}

using TileFn = void (*)(const float*, const float*, int64_t, const float*, float*, int64_t, int, const char*,
                        int64_t, int64_t);
constexpr TileFn kTiles[kMaxBlockRows + 1] = {nullptr,  &tile<1>, &tile<2>, &tile<3>, &tile<4>,
                                              &tile<5>, &tile<6>, &tile<7>, &tile<8>};

// Rows [r0, r0 + rows) by panel q, in blocks of at most 8 rows as even as possible (17 rows: 6 + 6 + 5, not
// 8 + 8 + 1, whose one-row block would be load-bound). With several blocks the next panel's lines are
// prefetched across them (30 layers at 32 rows: ~34-37 vs ~36-39 ms without). One block reads the weights
// once, as a single sequential stream the hardware prefetcher follows: explicit prefetches there only cost
// (1 row: ~16 vs ~13.5 ms per 30 layers).
RTP_AVX512 void panel_rows(const float* panels, const float* x, const float* bias, float* out, int64_t k,
                           int64_t n, int64_t q, int64_t r0, int64_t rows, const float* next) {
    const int64_t blocks = (rows + kMaxBlockRows - 1) / kMaxBlockRows;
    const int64_t panel_lines = k * kPanelCols * 4 / 64;
    const int64_t lines_per_block = next && blocks > 1 ? (panel_lines + blocks - 1) / blocks : 0;
    const int64_t per_step = (lines_per_block + k - 1) / k;
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, n - q * kPanelCols));
    const float* pan = panels + q * k * kPanelCols;
    const float* b = bias ? bias + q * kPanelCols : nullptr;
    int64_t r = r0, line = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t left = r0 + rows - r, mr = (left + (blocks - blk) - 1) / (blocks - blk);
        const int64_t lines = std::min(lines_per_block, panel_lines - line);
        kTiles[mr](pan, x + r * k, k, b, out + r * n + q * kPanelCols, n, cols,
                   reinterpret_cast<const char*>(next) + line * 64, std::max<int64_t>(lines, 0), per_step);
        line += std::max<int64_t>(lines, 0);
        r += mr;
    }
}

}  // namespace

void panel_linear_avx512(const float* panels, const float* x, const float* bias, float* out, int64_t m, int64_t k,
                         int64_t n) {
    const int64_t np = (n + kPanelCols - 1) / kPanelCols;
    for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, m - r0);
        at::parallel_for(0, np, 1, [&](int64_t begin, int64_t end) {
            for (int64_t q = begin; q < end; ++q)
                panel_rows(panels, x, bias, out, k, n, q, r0, rows,
                           q + 1 < end ? panels + (q + 1) * k * kPanelCols : nullptr);
        });
    }
}

}  // namespace rtp_llm

#else

namespace rtp_llm {
void panel_linear_avx512(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) {}
}  // namespace rtp_llm

#endif

namespace rtp_llm {

bool panel_linear_enabled() { return gemv_avx512_enabled(); }

at::Tensor pack_panels(const at::Tensor& w) {
    TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.numel() > 0,
                "pack_panels: w must be a non-empty float32 [N, K] CPU tensor");
    const int64_t n = w.size(0), k = w.size(1), np = (n + kPanelCols - 1) / kPanelCols;
    // [np * 48, K] zero-padded, then each panel's [48, K] block transposed to [K, 48], on 2 MB pages (the
    // panels are streamed at every step).
    auto padded = at::zeros({np * kPanelCols, k}, w.options());
    padded.narrow(0, 0, n).copy_(w);
    auto panels = huge_page_empty({np, k, kPanelCols}, at::kFloat);
    panels.copy_(padded.view({np, kPanelCols, k}).transpose(1, 2));
    return panels;
}

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                        int64_t n) {
    TORCH_CHECK(panel_linear_enabled(), "panel_linear: needs a CPU with AVX-512 (see panel_linear_enabled)");
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
                "panel_linear: x must be a float32 [M, K] CPU tensor");
    TORCH_CHECK(panels.scalar_type() == at::kFloat && panels.dim() == 3 && panels.size(2) == kPanelCols &&
                    panels.is_contiguous(),
                "panel_linear: panels must be pack_panels' contiguous float32 [ceil(N / 48), K, 48]");
    TORCH_CHECK(panels.size(1) == x.size(1), "panel_linear: x has ", x.size(1), " columns, the weight ",
                panels.size(1));
    TORCH_CHECK(n > (panels.size(0) - 1) * kPanelCols && n <= panels.size(0) * kPanelCols, "panel_linear: n = ", n,
                " does not match ", panels.size(0), " panels");
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "panel_linear: bias must be [", n, "]");
        b = bias->to(at::kFloat).contiguous();
    }
    auto xc = x.contiguous();
    auto out = at::empty({xc.size(0), n}, x.options());
    if (xc.size(0) > 0)
        panel_linear_avx512(panels.data_ptr<float>(), xc.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
                            out.data_ptr<float>(), xc.size(0), xc.size(1), n);
    return out;
}

TORCH_LIBRARY_FRAGMENT(rtp_llm, m) {
    m.def("pack_panels(Tensor w) -> Tensor");
    m.def("panel_linear(Tensor x, Tensor panels, Tensor? bias, int n) -> Tensor");
    m.def("panel_linear_enabled() -> bool", &panel_linear_enabled);
}

TORCH_LIBRARY_IMPL(rtp_llm, CPU, m) {
    m.impl("pack_panels", &pack_panels);
    m.impl("panel_linear", &panel_linear);
}

}  // namespace rtp_llm
