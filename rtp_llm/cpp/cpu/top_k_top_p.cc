// CPU twin of the top-k/top-p operator (the documented npu_top_k_top_p / apply_top_k_top_p_custom
// math), giving the same masks as rtp_llm/device/torch_ops.py (apply_top_k_top_p) without sorting the vocabulary.
//
// Per row (rows in parallel):
//   top-k: the k-th largest value by nth_element on a copy of the values; survivors are values >= it (ties
//          survive).
//   top-p: e = exp(x - max) over survivors in float64 (vec::exp4d), total = sum(e). Walking survivors in ascending
//          (value, index) order, a token is dropped while the cumulative sum <= (1 - p) * total; the
//          largest is always kept. Dropped tokens are a prefix of that order, so only a top set is sorted (first
//          the fewest top buckets of a mass histogram that hold the kept mass; should rounding put the boundary
//          below it, survivors >= the m-th largest, m doubling), and the mass below it is total - its sum.
// Float64 makes the result independent of summation order, so it matches the torch version's masks.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/expd.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace rtp_llm {
namespace {

struct Scored {
    float v;
    int32_t i;
};
// (value, index) ascending is the documented stable ascending order
inline bool ascending(const Scored& a, const Scored& b) { return a.v < b.v || (a.v == b.v && a.i < b.i); }

// The m-th largest of values (1 <= m <= n), with scratch as working space: a min-heap of the m largest in one
// pass when m is small against n (most values fail the one compare with its top), else nth_element.
inline float mth_largest(const float* values, int64_t n, int64_t m, std::vector<float>& scratch) {
    if (m * 16 <= n) {
        scratch.assign(values, values + m);
        std::make_heap(scratch.begin(), scratch.end(), std::greater<float>());
        for (int64_t i = m; i < n; ++i) {
            if (values[i] > scratch.front()) {
                std::pop_heap(scratch.begin(), scratch.end(), std::greater<float>());
                scratch.back() = values[i];
                std::push_heap(scratch.begin(), scratch.end(), std::greater<float>());
            }
        }
        return scratch.front();
    }
    scratch.assign(values, values + n);
    std::nth_element(scratch.begin(), scratch.begin() + (m - 1), scratch.end(), std::greater<float>());
    return scratch[m - 1];
}

// e[j] = exp(v[j] - mx) in float64 (vec::expd1's values, four lanes at a time).
inline void exp_shifted(const float* v, int64_t n, float mx, double* e) {
    int64_t j = 0;
#ifdef __AVX2__
    const __m256d m = _mm256_set1_pd(static_cast<double>(mx));
    for (; j + 4 <= n; j += 4)
        _mm256_storeu_pd(e + j, vec::exp4d(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(v + j)), m)));
#endif
    for (; j < n; ++j) e[j] = vec::expd1(static_cast<double>(v[j]) - mx);
}

template <typename T>
void row_top_k_top_p(const T* in, T* out, int64_t vocab, int64_t k, bool use_k, double p, bool use_p,
                     std::vector<float>& vals, std::vector<float>& scratch, std::vector<Scored>& top,
                     std::vector<double>& ebuf) {
    const T neg_inf = static_cast<T>(-std::numeric_limits<float>::infinity());
    vals.resize(vocab);
    for (int64_t i = 0; i < vocab; ++i) vals[i] = static_cast<float>(in[i]);
    const bool cut_k = use_k && k < vocab;
    // top-k survivors: values >= the k-th largest (ties survive); selected on a copy of the values, not indices
    const float thr_k = cut_k ? mth_largest(vals.data(), vocab, k, scratch) : 0.0f;
    auto survives = [&](int64_t i) { return !cut_k || vals[i] >= thr_k; };
    for (int64_t i = 0; i < vocab; ++i) out[i] = neg_inf;
    if (!use_p) {
        for (int64_t i = 0; i < vocab; ++i)
            if (survives(i)) out[i] = in[i];
        return;
    }
    if (cut_k) {  // the survivors' values, in scratch
        scratch.clear();
        for (int64_t i = 0; i < vocab; ++i)
            if (survives(i)) scratch.push_back(vals[i]);
    }
    const float* kept = cut_k ? scratch.data() : vals.data();
    const int64_t n = cut_k ? static_cast<int64_t>(scratch.size()) : vocab;
    const float mx = *std::max_element(kept, kept + n);
    // Mass per bucket of 1/8 logit below the max, beside the total: the fewest top buckets holding the kept mass
    // give the first top set to try, so one sort usually settles the row.
    constexpr int kBuckets = 512;
    auto bucket = [mx](float v) {
        const float d = (mx - v) * 8.0f;
        return d < kBuckets - 1 ? static_cast<int>(d) : kBuckets - 1;  // NaN and -inf: the last
    };
    double mass[kBuckets] = {};
    double total = 0.0;
    ebuf.resize(n);
    exp_shifted(kept, n, mx, ebuf.data());
    for (int64_t j = 0; j < n; ++j) {
        total += ebuf[j];
        mass[bucket(kept[j])] += ebuf[j];
    }
    const double drop_mass = (1.0 - p) * total;
    int last = 0;
    for (double acc = 0.0; last < kBuckets - 1; ++last)
        if ((acc += mass[last]) >= (total - drop_mass) + 1e-12 * total) break;

    // Sorts the top set (survivors for which `in_top`, an upper set of the value order) and keeps its tokens
    // above the boundary; false when the boundary lies below the set.
    auto settle = [&](bool all, auto in_top) {
        top.clear();
        for (int64_t i = 0; i < vocab; ++i)
            if (survives(i) && (all || in_top(vals[i]))) top.push_back({vals[i], static_cast<int32_t>(i)});
        std::sort(top.begin(), top.end(), ascending);
        double top_mass = 0.0;
        for (const Scored& s : top) top_mass += vec::expd1(static_cast<double>(s.v) - mx);
        const double below = all ? 0.0 : total - top_mass;  // mass of the survivors under the top set
        if (!all && below > drop_mass) return false;
        double cum = below;
        for (size_t j = 0; j < top.size(); ++j) {
            cum += vec::expd1(static_cast<double>(top[j].v) - mx);
            if (cum > drop_mass || j + 1 == top.size()) out[top[j].i] = in[top[j].i];
        }
        return true;
    };
    if (settle(last == kBuckets - 1, [&](float v) { return bucket(v) <= last; })) return;
    std::vector<float> sel;
    for (int64_t m = std::min<int64_t>(std::max<int64_t>(1, 2 * static_cast<int64_t>(top.size())), n);;
         m = std::min<int64_t>(2 * m, n)) {
        // survivors >= the m-th largest survivor (ties included)
        const float thr = m < n ? mth_largest(kept, n, m, sel) : 0.0f;
        if (settle(m == n, [thr](float v) { return v >= thr; })) return;
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
            std::vector<float> vals, scratch;
            std::vector<Scored> top;
            std::vector<double> ebuf;
            for (int64_t r = begin; r < end; ++r) {
                const int64_t kk = kt.defined() ? std::min(std::max<int64_t>(kt.data_ptr<int64_t>()[r], 1), vocab) : vocab;
                const double pp = pt.defined() ? static_cast<double>(pt.data_ptr<float>()[r]) : 1.0;
                row_top_k_top_p(in + r * vocab, o + r * vocab, vocab, kk, kt.defined(), pp, pt.defined(), vals, scratch,
                                top, ebuf);
            }
        });
    });
    return out;
}

}  // namespace rtp_llm
