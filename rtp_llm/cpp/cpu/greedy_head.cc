// The greedy token of each row, exactly argmax(h @ W^T) as the fp32 panel kernel computes the logits, without
// computing all of them in fp32.
//
// Why: with every sampled row greedy (and no penalties or logprobs) only the argmax of the LM head is used,
// and the LM head is the largest single matrix (SmolLM2: 49152 x 576). Here a bf16 copy of W screens the
// vocabulary (avx512_bf16 dot products: twice the fp32 FMA rate, half the bytes; AMX tiles where the CPU has them
// and K is a multiple of 32, several times faster again at a step's 32 rows), a proven error bound per logit
// keeps every token that could still be the fp32 argmax, and only those few are recomputed in fp32 in the panel
// kernel's exact summation order (candidates per row and the speed-up: benchmarks.cpu_greedy_head).
//
// The bound, per row x and vocab row w_j (x~, w~ their bf16 roundings; a_j the screen's value, e_j the exact
// fp32 logit; gamma = K u / (1 - K u), u = 2^-24):
//   |e_j - x.w_j|     <= gamma |x| |w_j|           (e_j: one FMA chain over K terms)
//   |a_j - x~.w~_j|   <= gamma |x~| |w~_j| + tiny   (products of bf16 are exact in fp32; <= K rounded adds per
//                                                   term, vdpbf16ps's and TDPBF16PS's alike: Intel documents both
//                                                   as rounding each accumulation to nearest even, and AMX's
//                                                   measured sums round less; "tiny" covers both instructions'
//                                                   denormal flushing)
//   |x.w_j - x~.w~_j| <= |x| |w_j - w~_j| + |x - x~| |w~_j|      (Cauchy-Schwarz)
// so |e_j - a_j| <= B_j = alpha d_j + beta m_j + delta n_j + c0 with the per-vocab norms d_j = |w_j - w~_j|,
// m_j = |w~_j|, n_j = |w_j| (packed once, rounded up) and per-row alpha = |x|, beta = |x - x~| + gamma |x~|,
// delta = gamma |x|. With T = max_j (a_j - B_j) <= e of the token attaining it, any j with a_j + B_j < T has
// e_j < T: it cannot be the argmax. Float rounding in these comparisons is covered by a margin (see below).
// Ties among the candidates go to the lowest index, as torch.argmax does.
#include <ATen/Parallel.h>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace rtp_llm {

// The screen is W rounded to bf16 in the bf16 panel kernel's layout (pack_pair_panels), multiplied by that
// kernel with fp32 outputs.
constexpr int64_t kScreenCols = kPanelCols;

namespace {

uint16_t bf16_bits(float v) { return c10::BFloat16(v).x; }  // round to nearest even
float bf16_value(float v) { return static_cast<float>(c10::BFloat16(v)); }

// A float at least v (v >= 0) and above it by a relative 2^-20: covers the float rounding of the few
// operations that use it.
float round_up(double v) { return static_cast<float>(v * (1.0 + std::ldexp(1.0, -20))); }

}  // namespace
}  // namespace rtp_llm

#if defined(__x86_64__) && defined(__GNUC__)
#include "rtp_llm/cpp/cpu/vec/avx512.h"

namespace rtp_llm {
namespace {

// The vocab rows j whose window [a_j - B_j, a_j + B_j] reaches the highest lower end T (in increasing j).
// B_j = alpha d_j + beta m_j + delta n_j + c0 (bounds = [d; m; n], each [n]). a_j - B_j and a_j + B_j round
// in float by at most 2^-24 (|a| + B); the threshold is lowered by 2^-20 (max |a| + max B), far more than
// both roundings together. False when the row's values overflowed.
RTP_AVX512 bool screen_candidates(const float* a, const float* bounds, int64_t n, float alpha, float beta,
                                  float delta, float c0, float* bound, std::vector<int64_t>& candidates) {
    const float *dn = bounds, *mn = bounds + n, *nn = bounds + 2 * n;
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta), vd = _mm512_set1_ps(delta),
                 vc = _mm512_set1_ps(c0);
    __m512 lower = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), amax = _mm512_setzero_ps(),
           bmax = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = n - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - j)) - 1);
        const __m512 b = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, dn + j),
                                         _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, mn + j),
                                                         _mm512_fmadd_ps(vd, _mm512_maskz_loadu_ps(m, nn + j), vc)));
        const __m512 x = _mm512_maskz_loadu_ps(m, a + j);
        _mm512_mask_storeu_ps(bound + j, m, b);
        lower = _mm512_mask_max_ps(lower, m, lower, _mm512_sub_ps(x, b));
        amax = _mm512_max_ps(amax, _mm512_abs_ps(x));
        bmax = _mm512_max_ps(bmax, b);
    }
    const float low = _mm512_reduce_max_ps(lower);
    const float margin = std::ldexp(_mm512_reduce_max_ps(amax) + _mm512_reduce_max_ps(bmax), -20);
    if (!std::isfinite(low) || !std::isfinite(margin)) return false;
    const __m512 t = _mm512_set1_ps(low - margin);
    candidates.clear();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = n - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - j)) - 1);
        const __m512 hi = _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + j), _mm512_maskz_loadu_ps(m, bound + j));
        for (unsigned bits = _mm512_mask_cmp_ps_mask(m, hi, t, _CMP_GE_OQ); bits; bits &= bits - 1)
            candidates.push_back(j + __builtin_ctz(bits));
    }
    return true;
}

}  // namespace
}  // namespace rtp_llm
#else
namespace rtp_llm {
namespace {
bool screen_candidates(const float*, const float*, int64_t, float, float, float, float, float*,
                       std::vector<int64_t>&) {
    return false;  // never called: cpu_avx512_bf16() is false off x86-64
}
}  // namespace
}  // namespace rtp_llm
#endif

namespace rtp_llm {

at::Tensor greedy_bounds(const at::Tensor& w) {
    TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.numel() > 0,
                "greedy_bounds: w must be a non-empty float32 [N, K] CPU tensor");
    TORCH_CHECK(at::isfinite(w).all().item<bool>(), "greedy_bounds: w has non-finite values");
    auto wc = w.contiguous();
    const int64_t n = wc.size(0), k = wc.size(1);
    auto bounds = at::empty({3, n}, wc.options());  // d_j, m_j, n_j
    const float* wp = wc.data_ptr<float>();
    float* bp = bounds.data_ptr<float>();
    parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
            const float* row = wp + j * k;
            double diff = 0, rounded = 0, exact = 0;
            for (int64_t i = 0; i < k; ++i) {
                const double v = row[i], t = bf16_value(row[i]);
                diff += (v - t) * (v - t), rounded += t * t, exact += v * v;
            }
            bp[j] = round_up(std::sqrt(diff)), bp[n + j] = round_up(std::sqrt(rounded)),
            bp[2 * n + j] = round_up(std::sqrt(exact));
        }
    });
    return bounds;
}

at::Tensor quant_greedy_bounds(const at::Tensor& packed, int64_t n) {
    TORCH_CHECK(cpu_avx512(), "quant_greedy_bounds: needs a CPU with AVX-512");
    const int format = quant_packed_format(packed, n, "quant_greedy_bounds");
    const int64_t k = packed.size(1) * quant_packed_elements(format);
    auto bounds = at::empty({3, n}, at::TensorOptions().dtype(at::kFloat));
    const uint8_t* w = packed.data_ptr<uint8_t>();
    float* bp = bounds.data_ptr<float>();
    std::atomic<bool> finite{true};
    parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
        std::vector<float> row(k);  // one decoded row at a time: no dequantized copy of the head
        for (int64_t j = begin; j < end; ++j) {
            quant_row_avx512(format, w, k, j, row.data());
            double diff = 0, rounded = 0, exact = 0;
            for (int64_t i = 0; i < k; ++i) {
                if (!std::isfinite(row[i])) finite = false;
                const double v = row[i], t = bf16_value(row[i]);
                diff += (v - t) * (v - t), rounded += t * t, exact += v * v;
            }
            bp[j] = round_up(std::sqrt(diff)), bp[n + j] = round_up(std::sqrt(rounded)),
            bp[2 * n + j] = round_up(std::sqrt(exact));
        }
    });
    TORCH_CHECK(finite.load(), "quant_greedy_bounds: the weight has non-finite values");
    return bounds;
}

std::tuple<at::Tensor, at::Tensor> pack_greedy_screen(const at::Tensor& w) {
    TORCH_CHECK(cpu_avx512_bf16(), "pack_greedy_screen: needs a CPU with AVX-512 and avx512_bf16");
    auto bounds = greedy_bounds(w);
    return {pack_pair_panels(w.contiguous()), bounds};
}

namespace {

// The ids for rows h [R, K] of a head of n rows: `screen` fills approx [R, n] from x~ as bf16 pairs, `row(j, buf)`
// gives vocab row j's fp32 weights (a pointer into the weight, or buf filled).
template <typename Screen, typename Row>
at::Tensor greedy_ids(const at::Tensor& h, const at::Tensor& bounds, int64_t n, Screen&& screen, Row&& row) {
    TORCH_CHECK(bounds.scalar_type() == at::kFloat && bounds.is_contiguous() && bounds.dim() == 2 &&
                    bounds.size(0) == 3 && bounds.size(1) == n,
                "greedy_head: bounds must be greedy_bounds of the head's [", n, ", K] weights");
    const int64_t rows = h.size(0), k = h.size(1), pairs = (k + 1) / 2;
    auto ids = at::full({rows}, -1, h.options().dtype(at::kLong));
    if (rows == 0) return ids;
    auto hc = h.contiguous();
    const float* xp = hc.data_ptr<float>();

    // Per row: x~ as pairs, the bound's coefficients, and whether the row is finite (a row that is not
    // keeps id -1: the caller computes its logits in full, where torch.argmax decides what NaN means).
    std::vector<uint32_t> xpairs(rows * pairs, 0u);
    std::vector<float> alpha(rows), beta(rows), delta(rows), c0(rows);
    std::vector<char> finite(rows, 1);
    const double u = std::ldexp(1.0, -24), gamma = k * u / (1 - k * u), tiny = std::ldexp(1.0, -100);
    for (int64_t r = 0; r < rows; ++r) {
        const float* x = xp + r * k;
        double nx = 0, nd = 0, nt = 0;
        for (int64_t i = 0; i < k; ++i) {
            if (!std::isfinite(x[i])) finite[r] = 0;
            const double v = x[i], t = bf16_value(x[i]);
            nx += v * v, nd += (v - t) * (v - t), nt += t * t;
        }
        for (int64_t i = 0; i < pairs; ++i) {
            const uint32_t lo = bf16_bits(x[2 * i]), hi = 2 * i + 1 < k ? bf16_bits(x[2 * i + 1]) : 0u;
            xpairs[r * pairs + i] = lo | (hi << 16);
        }
        nx = std::sqrt(nx), nd = std::sqrt(nd), nt = std::sqrt(nt);
        const double sk = std::sqrt(static_cast<double>(k));
        alpha[r] = round_up(nx), beta[r] = round_up(nd + gamma * nt + tiny * sk), delta[r] = round_up(gamma * nx);
        c0[r] = round_up(tiny * (sk * nt + k));
    }

    // The screen: approximate logits [rows, n], the bf16 panel kernel's fp32 sums.
    std::vector<float> approx(rows * n);
    const int64_t ld = n;
    screen(xpairs.data(), approx.data(), rows, pairs);

    // Per row: the threshold, the candidates, their exact logits.
    const float* dn = bounds.data_ptr<float>();
    int64_t* out = ids.data_ptr<int64_t>();
    parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> bound(n), buf(k);
        std::vector<int64_t> candidates;
        for (int64_t r = begin; r < end; ++r) {
            if (!finite[r]) continue;
            const float* x = xp + r * k;
            if (!screen_candidates(approx.data() + r * ld, dn, n, alpha[r], beta[r], delta[r], c0[r], bound.data(),
                                   candidates))
                continue;  // an overflowed screen: the caller computes this row's logits in full
            int64_t best = -1;
            float best_logit = 0;
            for (const int64_t j : candidates) {  // in increasing j: ties keep the lowest index
                // The panel kernel's order: one FMA chain over k from zero.
                const float* w = row(j, buf.data());
                float e = 0.f;
                for (int64_t i = 0; i < k; ++i) e = std::fma(w[i], x[i], e);
                if (best < 0 || e > best_logit) best = j, best_logit = e;
            }
            out[r] = best;
        }
    });
    return ids;
}

void check_rows(const at::Tensor& h, const char* op) {
    TORCH_CHECK(cpu_avx512_bf16(), op, ": needs a CPU with AVX-512 and avx512_bf16");
    TORCH_CHECK(h.device().is_cpu() && h.scalar_type() == at::kFloat && h.dim() == 2, op,
                ": h must be a float32 [R, K] CPU tensor");
}

}  // namespace

at::Tensor greedy_head(const at::Tensor& h, const at::Tensor& screen, const at::Tensor& bounds,
                       const at::Tensor& weight) {
    check_rows(h, "greedy_head");
    TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.is_contiguous() &&
                    weight.size(1) == h.size(1),
                "greedy_head: weight must be the contiguous float32 [N, K] the screen was packed from");
    const int64_t k = h.size(1), n = weight.size(0), pairs = (k + 1) / 2;
    const int64_t np = (n + kScreenCols - 1) / kScreenCols;
    TORCH_CHECK(screen.scalar_type() == at::kInt && screen.is_contiguous() && screen.dim() == 3 &&
                    screen.size(0) == np && screen.size(1) == pairs && screen.size(2) == kScreenCols,
                "greedy_head: screen must be pack_greedy_screen(weight)[0]");
    const float* wp = weight.data_ptr<float>();
    return greedy_ids(
        h, bounds, n,
        [&](const uint32_t* x_pairs, float* approx, int64_t rows, int64_t steps) {
            panel_linear_bf16(reinterpret_cast<const uint32_t*>(screen.data_ptr<int32_t>()), x_pairs, nullptr,
                              approx, rows, steps, n);
        },
        [&](int64_t j, float*) { return wp + j * k; });
}

at::Tensor quant_greedy_head(const at::Tensor& h, const at::Tensor& packed, const at::Tensor& bounds, int64_t n) {
    check_rows(h, "quant_greedy_head");
    const int format = quant_packed_format(packed, n, "quant_greedy_head");
    const int64_t k = h.size(1);
    TORCH_CHECK(k == packed.size(1) * quant_packed_elements(format), "quant_greedy_head: h has ", k,
                " columns, the weight ", packed.size(1) * quant_packed_elements(format));
    const uint8_t* w = packed.data_ptr<uint8_t>();
    return greedy_ids(
        h, bounds, n,
        [&](const uint32_t* x_pairs, float* approx, int64_t rows, int64_t) {
            quant_screen_avx512(format, w, x_pairs, approx, rows, k, n);
        },
        [&](int64_t j, float* buf) {
            quant_row_avx512(format, w, k, j, buf);
            return static_cast<const float*>(buf);
        });
}

}  // namespace rtp_llm
