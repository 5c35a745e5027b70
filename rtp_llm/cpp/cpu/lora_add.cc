// LoRA deltas on a linear layer's output, every adapter group of a step in one call (the Punica shrink / expand
// per group): y[t] += (a @ x[t]) @ bt for each row t of a group, a [r, K] and bt [r, N] its adapter's float32
// A and scaled B^T (rtp_llm/lora/layers.py joins a fused layer's modules into them).
//
// Why a kernel: a step with several adapters made ~4 ATen calls and two GEMM calls per (layer, linear, group), each
// tiny (8 rows, rank 16) and each paying dispatch and thread wake-ups; here the shrink and the expand of every
// group's rows are two passes of rtp_llm::parallel_for. Each row's delta is computed by one thread in an order fixed
// by the element (float32, k ascending in 16-lane partial sums, then j ascending), so a row's bits do not depend on
// its group, the step or the thread: the Python layers and decoder_layers call this same kernel.
#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

namespace rtp_llm {
namespace {

constexpr int64_t kColumns = 512;  // expand's columns per chunk

// sum_k x[k] * a[k] in float32: 16 partial sums (lane l takes k = l mod 16), added pairwise at the end, so that the
// order is the same whatever the compiler's vector width.
inline float dot16(const float* x, const float* a, int64_t k) {
    float part[16] = {};
    int64_t i = 0;
    for (; i + 16 <= k; i += 16)
#pragma omp simd
        for (int l = 0; l < 16; ++l) part[l] += x[i + l] * a[i + l];
    for (int l = 0; i + l < k; ++l) part[l] += x[i + l] * a[i + l];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; ++l) part[l] += part[l + w];
    return part[0];
}

struct Group {
    const int64_t* rows;  // nullptr: rows 0..n-1
    int64_t n, r;
    const float* a;
    const float* bt;
    int64_t mid;  // offset of its rows' shrink outputs in the scratch
};

template <typename T>
void run(const at::Tensor& x, at::Tensor& y, const std::vector<Group>& groups, int64_t total_rows) {
    const int64_t k = x.size(1), n_out = y.size(1);
    const T* xp = x.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    int64_t mids = 0;
    for (const Group& g : groups) mids += g.n * g.r;
    std::vector<float> mid(mids);
    // (group, row) pairs in order, for the two passes
    std::vector<std::pair<int32_t, int64_t>> items;
    items.reserve(total_rows);
    for (size_t gi = 0; gi < groups.size(); ++gi)
        for (int64_t i = 0; i < groups[gi].n; ++i) items.emplace_back(static_cast<int32_t>(gi), i);
    const auto row_of = [&](const Group& g, int64_t i) { return g.rows ? g.rows[i] : i; };
    parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
        std::vector<float> xf(k);
        for (int64_t it = b; it < e; ++it) {
            const Group& g = groups[items[it].first];
            const int64_t i = items[it].second;
            const T* xr = xp + row_of(g, i) * k;
            for (int64_t c = 0; c < k; ++c) xf[c] = static_cast<float>(xr[c]);
            float* m = mid.data() + g.mid + i * g.r;
            for (int64_t j = 0; j < g.r; ++j) m[j] = dot16(xf.data(), g.a + j * k, k);
        }
    });
    const int64_t blocks = (n_out + kColumns - 1) / kColumns;
    parallel_for(0, static_cast<int64_t>(items.size()) * blocks, 1, [&](int64_t b, int64_t e) {
        float acc[kColumns];
        for (int64_t it = b; it < e; ++it) {
            const Group& g = groups[items[it / blocks].first];
            const int64_t i = items[it / blocks].second, c0 = (it % blocks) * kColumns;
            const int64_t w = std::min(kColumns, n_out - c0);
            const float* m = mid.data() + g.mid + i * g.r;
            std::fill(acc, acc + w, 0.0f);
            for (int64_t j = 0; j < g.r; ++j) {
                const float mj = m[j];
                const float* bj = g.bt + j * n_out + c0;
#pragma omp simd
                for (int64_t c = 0; c < w; ++c) acc[c] += mj * bj[c];
            }
            T* yr = yp + row_of(g, i) * n_out + c0;
            for (int64_t c = 0; c < w; ++c) yr[c] = vec::to<T>(static_cast<float>(yr[c]) + acc[c]);
        }
    });
}

}  // namespace

void lora_add_(at::Tensor& y, const at::Tensor& x, const c10::List<std::optional<at::Tensor>>& rows,
               const c10::List<at::Tensor>& a, const c10::List<at::Tensor>& bt) {
    TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && x.size(0) == y.size(0) && x.is_contiguous() && y.is_contiguous(),
                "lora_add_: x [T, K] and y [T, N], contiguous");
    TORCH_CHECK(x.scalar_type() == y.scalar_type() &&
                    (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
                "lora_add_: x and y both float32 or both bfloat16");
    TORCH_CHECK(rows.size() == a.size() && a.size() == bt.size(), "lora_add_: rows, a and bt per group");
    const int64_t tokens = x.size(0), k = x.size(1), n_out = y.size(1);
    std::vector<Group> groups;
    std::vector<at::Tensor> keep;
    std::vector<char> taken(tokens, 0);  // each row in one group at most: its output has one writer
    int64_t mid = 0, total = 0;
    for (size_t gi = 0; gi < a.size(); ++gi) {
        const at::Tensor ag = a.get(gi), bg = bt.get(gi);
        TORCH_CHECK(ag.scalar_type() == at::kFloat && bg.scalar_type() == at::kFloat && ag.is_contiguous() &&
                        bg.is_contiguous() && ag.dim() == 2 && bg.dim() == 2 && ag.size(1) == k &&
                        bg.size(0) == ag.size(0) && bg.size(1) == n_out,
                    "lora_add_: a [r, K] and bt [r, N] contiguous float32 per group");
        Group g{nullptr, tokens, ag.size(0), ag.data_ptr<float>(), bg.data_ptr<float>(), mid};
        const std::optional<at::Tensor> rg = rows.get(gi);
        if (rg.has_value() && rg->defined()) {
            const at::Tensor r = rg->to(at::kLong).contiguous();
            TORCH_CHECK(r.dim() == 1, "lora_add_: rows must be [n]");
            const int64_t* rp = r.data_ptr<int64_t>();
            for (int64_t i = 0; i < r.numel(); ++i) {
                TORCH_CHECK(rp[i] >= 0 && rp[i] < tokens, "lora_add_: row ", rp[i], " outside [0, ", tokens, ")");
                TORCH_CHECK(!taken[rp[i]]++, "lora_add_: row ", rp[i], " in two groups");
            }
            g.rows = rp;
            g.n = r.numel();
            keep.push_back(r);
        } else {
            for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(!taken[t]++, "lora_add_: row ", t, " in two groups");
        }
        mid += g.n * g.r;
        total += g.n;
        groups.push_back(g);
    }
    if (total == 0) return;
    if (x.scalar_type() == at::kFloat) {
        run<float>(x, y, groups, total);
    } else {
        run<c10::BFloat16>(x, y, groups, total);
    }
}

}  // namespace rtp_llm
