// out = x @ W^T (+ bias) for a few rows x [M <= 16, K] and a plain weight W [N, K]: the decode GEMV of
// steps of a few sequences, which is memory-bound: every weight byte is read once per step for very little
// arithmetic. Splits N across threads (at::parallel_for) and streams four weight rows at a time against
// the input rows taken in pairs (8 independent FMA chains; dot4 below). float32 and bfloat16 weights
// (bf16 products and fp32 accumulation, rounded once at the end, as torch does). From a few rows oneDNN's
// packed GEMM is faster than this AVX2 kernel and callers switch to it (rtp_llm/device/cpu/linear.py:
// GEMV_MAX_ROWS, from benchmarks.cpu_linear --stream). CPUs with AVX-512 take gemv_avx512.cc instead, which
// stays at the memory bandwidth up to 8 rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"

#include <cmath>
#include <optional>
#include <vector>

namespace rtp_llm {
namespace {

// Rows ahead whose columns are prefetched into L2 (into L1, prefetches stall the core once its miss buffers
// fill): a core streaming short rows (1-2 KB) otherwise waits on each new row's first lines.
constexpr int64_t kPrefetchRows = 16;
constexpr int kPrefetchLocality = 2;

// Rows w, w + k, w + 2k, w + 3k against G input rows x, x + k, ...: out[g * 4 + q] = <w_q, x_g>.
// G = 2 gives 8 independent FMA chains, enough to cover the FMA latency on two pipes (4 chains, one input
// row, run at half the FMA rate: fine while the step streams weights, not at 5-8 rows), and each weight
// vector loaded (and for bf16 widened) once serves both rows. Every output is still summed in the same order
// (one 8-lane accumulator over k, then hsum, then the tail), so the grouping never changes a result.
template <typename T, int G>
inline void dot4(const T* w, const float* x, int64_t k, bool prefetch, float* out) {
    const T *w0 = w, *w1 = w + k, *w2 = w + 2 * k, *w3 = w + 3 * k;
    int64_t i = 0;
#ifdef __AVX2__
    using vec::hsum;
    using vec::load8;
    constexpr int64_t line = 64 / sizeof(T);
    const int64_t ahead = kPrefetchRows * k;
    __m256 acc[G][4];
    for (int g = 0; g < G; ++g)
        for (int q = 0; q < 4; ++q) acc[g][q] = _mm256_setzero_ps();
    for (; i + 8 <= k; i += 8) {
        if (prefetch && i % line == 0) {
            for (const T* p : {w0, w1, w2, w3}) __builtin_prefetch(p + ahead + i, 0, kPrefetchLocality);
        }
        const __m256 v0 = load8(w0 + i), v1 = load8(w1 + i), v2 = load8(w2 + i), v3 = load8(w3 + i);
        for (int g = 0; g < G; ++g) {
            const __m256 xi = _mm256_loadu_ps(x + g * k + i);
            acc[g][0] = _mm256_fmadd_ps(v0, xi, acc[g][0]);
            acc[g][1] = _mm256_fmadd_ps(v1, xi, acc[g][1]);
            acc[g][2] = _mm256_fmadd_ps(v2, xi, acc[g][2]);
            acc[g][3] = _mm256_fmadd_ps(v3, xi, acc[g][3]);
        }
    }
    for (int g = 0; g < G; ++g)
        for (int q = 0; q < 4; ++q) out[g * 4 + q] = hsum(acc[g][q]);
#else
    (void)prefetch;
    for (int j = 0; j < 4 * G; ++j) out[j] = 0.f;
#endif
    // The tail (or everything, without AVX2), fused multiply-adds spelled out: left to the compiler, a + b * c
    // is contracted in some instantiations and not in others, and a row's result would depend on G.
    for (; i < k; ++i) {
        for (int g = 0; g < G; ++g) {
            const float xv = x[g * k + i];
            out[g * 4 + 0] = std::fma(static_cast<float>(w0[i]), xv, out[g * 4 + 0]);
            out[g * 4 + 1] = std::fma(static_cast<float>(w1[i]), xv, out[g * 4 + 1]);
            out[g * 4 + 2] = std::fma(static_cast<float>(w2[i]), xv, out[g * 4 + 2]);
            out[g * 4 + 3] = std::fma(static_cast<float>(w3[i]), xv, out[g * 4 + 3]);
        }
    }
}

template <typename T>
void gemv_rows(const at::Tensor& x, const at::Tensor& w, const float* bias, at::Tensor& out) {
    const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
    const T* wp = w.data_ptr<T>();
    T* op = out.data_ptr<T>();
    std::vector<float> xf(m * k);  // the inputs in float32 once, not once per weight row
    const T* xp = x.data_ptr<T>();
    for (int64_t i = 0; i < m * k; ++i) xf[i] = static_cast<float>(xp[i]);
    if (cpu_avx512()) return gemv_avx512(wp, xf.data(), bias, op, m, k, n);
    auto store = [&](int64_t r, int64_t j, float v) { op[r * n + j] = static_cast<T>(bias ? v + bias[j] : v); };
    // Grain 16 blocks: a task streams >= 64 weight rows, enough to amortise the scheduling.
    parallel_for(0, (n + 3) / 4, 16, [&](int64_t begin, int64_t end) {
        float res[8];
        for (int64_t blk = begin; blk < end; ++blk) {
            const int64_t j = blk * 4;
            if (j + 4 <= n) {
                // Input rows in pairs; the first pass brings the 4 weight rows into L1 (and prefetches ahead),
                // later passes read them from there.
                int64_t r = 0;
                for (; r + 2 <= m; r += 2) {
                    dot4<T, 2>(wp + j * k, &xf[r * k], k, r == 0, res);
                    for (int q = 0; q < 4; ++q) store(r, j + q, res[q]), store(r + 1, j + q, res[4 + q]);
                }
                if (r < m) {
                    dot4<T, 1>(wp + j * k, &xf[r * k], k, r == 0, res);
                    for (int q = 0; q < 4; ++q) store(r, j + q, res[q]);
                }
            } else {
                for (int64_t jj = j; jj < n; ++jj)
                    for (int64_t r = 0; r < m; ++r) store(r, jj, vec::dot(wp + jj * k, &xf[r * k], k));
            }
        }
    });
}

}  // namespace

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
    TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "gemv: CPU tensors only");
    const auto dtype = x.scalar_type();
    TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && w.scalar_type() == dtype,
                "gemv: x and w must both be float32 or both bfloat16, got ", dtype, " and ",
                w.scalar_type());
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "gemv: x [M, K], w [N, K]");
    TORCH_CHECK(x.size(0) <= kGemvMaxRows, "gemv: at most ", kGemvMaxRows, " rows");
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == w.size(0), "gemv: bias must be [N]");
        b = bias->to(at::kFloat).contiguous();
    }
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    auto out = at::empty({xc.size(0), wc.size(0)}, x.options());
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    if (dtype == at::kFloat)
        gemv_rows<float>(xc, wc, bp, out);
    else
        gemv_rows<c10::BFloat16>(xc, wc, bp, out);
    return out;
}

}  // namespace rtp_llm
