// CPU twin of the top-k/top-p operator (the documented npu_top_k_top_p / apply_top_k_top_p_custom
// math), giving the same masks as rtp_llm/device/torch_ops.py (apply_top_k_top_p) without sorting the vocabulary.
//
// Per row (rows in parallel):
//   top-k: the k-th largest value by nth_element; survivors are values >= it (ties survive).
//   top-p: e = exp(x - max) over survivors in float64, total = sum(e). Walking survivors in ascending
//          (value, index) order, a token is dropped while the cumulative sum <= (1 - p) * total; the
//          largest is always kept. Dropped tokens are a prefix of that order, so only the top m
//          survivors are sorted (m doubling from 256 until the boundary is inside them), and the mass
//          below them is total - their sum.
// Float64 makes the result independent of summation order, so it matches the torch version's masks.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace rtp_llm {
namespace {

template <typename T>
void row_top_k_top_p(const T* in, T* out, int64_t vocab, int64_t k, bool use_k, double p, bool use_p,
                     std::vector<int32_t>& idx, std::vector<double>& e) {
    const T neg_inf = static_cast<T>(-std::numeric_limits<float>::infinity());
    auto value = [&](int32_t i) { return static_cast<float>(in[i]); };
    // (value, index) ascending is the documented stable ascending order
    auto less = [&](int32_t a, int32_t b) { return value(a) < value(b) || (value(a) == value(b) && a < b); };
    auto greater = [&](int32_t a, int32_t b) { return less(b, a); };

    idx.resize(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    int64_t n = vocab;  // survivors are idx[0, n)
    if (use_k && k < vocab) {
        std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), greater);
        const float thr = value(idx[k - 1]);
        n = std::partition(idx.begin(), idx.end(), [&](int32_t i) { return value(i) >= thr; }) - idx.begin();
    }
    for (int64_t i = 0; i < vocab; ++i) out[i] = neg_inf;
    if (!use_p) {
        for (int64_t j = 0; j < n; ++j) out[idx[j]] = in[idx[j]];
        return;
    }
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, value(idx[j]));
    e.resize(vocab);
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j) total += (e[idx[j]] = std::exp(static_cast<double>(value(idx[j])) - mx));
    const double drop_mass = (1.0 - p) * total;

    for (int64_t m = std::min<int64_t>(256, n);; m = std::min<int64_t>(2 * m, n)) {
        // the top m survivors, in ascending order, at idx[n - m, n)
        std::nth_element(idx.begin(), idx.begin() + (n - m), idx.begin() + n, less);
        std::sort(idx.begin() + (n - m), idx.begin() + n, less);
        double below = 0.0;  // mass of the survivors under the top m
        for (int64_t j = 0; j < n - m; ++j) below += e[idx[j]];
        if (m < n && below > drop_mass) continue;  // the boundary is further down: widen
        double cum = below;
        for (int64_t j = n - m; j < n; ++j) {
            cum += e[idx[j]];
            if (cum > drop_mass || j == n - 1) out[idx[j]] = in[idx[j]];
        }
        return;
    }
}

}  // namespace

at::Tensor apply_top_k_top_p(const at::Tensor& logits, const std::optional<at::Tensor>& k,
                             const std::optional<at::Tensor>& p) {
    TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2, "logits must be a 2-D CPU tensor");
    auto x = logits.contiguous();
    const int64_t rows = x.size(0), vocab = x.size(1);
    at::Tensor kt, pt;
    if (k.has_value()) {
        kt = k->to(at::kLong).contiguous();
        TORCH_CHECK(kt.dim() == 1 && kt.size(0) == rows, "k must be [rows]");
    }
    if (p.has_value()) {
        pt = p->to(at::kFloat).contiguous();  // p as the float the torch version compares with
        TORCH_CHECK(pt.dim() == 1 && pt.size(0) == rows, "p must be [rows]");
    }
    auto out = at::empty_like(x);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "apply_top_k_top_p", [&] {
        const scalar_t* in = x.data_ptr<scalar_t>();
        scalar_t* o = out.data_ptr<scalar_t>();
        parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
            std::vector<int32_t> idx;
            std::vector<double> e;
            for (int64_t r = begin; r < end; ++r) {
                const int64_t kk = kt.defined() ? std::min(std::max<int64_t>(kt.data_ptr<int64_t>()[r], 1), vocab) : vocab;
                const double pp = pt.defined() ? static_cast<double>(pt.data_ptr<float>()[r]) : 1.0;
                row_top_k_top_p(in + r * vocab, o + r * vocab, vocab, kk, kt.defined(), pp, pt.defined(), idx, e);
            }
        });
    });
    return out;
}

}  // namespace rtp_llm
