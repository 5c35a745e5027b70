// LoRA deltas on a linear layer's output, every adapter group of a step in one call (the Punica shrink / expand
// per group): y[t] += (x[t] @ a_t) @ bt for each row t of a group, a_t [K, r] and bt [r, N] its adapter's float32
// A^T and scaled B^T (rtp_llm/lora/layers.py joins a fused layer's modules into them).
//
// Why a kernel: a step with several adapters made ~4 ATen calls and two GEMM calls per (layer, linear, group), each
// tiny (8 rows, rank 16) and each paying dispatch and thread wake-ups; here the shrink and the expand of every
// group's rows are one rtp_llm::parallel_for over blocks of up to 8 rows of a group (the adapter's weights read once
// per block; a decode step's wide outputs split by columns across threads). Each output element is computed by one thread in an order
// fixed by the element (float32 multiply-adds, k ascending, then j ascending), so a row's bits do not depend on its
// group, the step or the thread: the Python layers and decoder_layers call this same kernel.
#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

namespace rtp_llm {
namespace {

constexpr int64_t kColumns = 512;      // expand's columns per pass over the rank
constexpr int64_t kPartColumns = 1024;  // a split decode step's parts hold at least this many columns
constexpr int64_t kMinBytes = 1 << 16;  // adapter weight bytes below which a call runs on the calling thread
constexpr int64_t kRows = 8;           // rows of a group computed together (the adapter's weights read once)

struct Group {
    const int64_t* rows;  // nullptr: rows 0..n-1
    int64_t n, r;
    const float* at;  // [K, r]
    const float* bt;  // [r, N]
};

// Q rows of one group: the shrink and the expand with Q independent chains; every row gets the same operations in
// the same order whatever Q and its slot, so its bits do not depend on the rows beside it.
template <int Q, typename T>
void rows_block(const Group& g, const T* const* xr, T* const* yr, int64_t k, int64_t n_out, int64_t c_begin,
                int64_t c_end, float* mid, float* acc) {
    const int64_t r = g.r;
    std::fill(mid, mid + Q * r, 0.0f);
    for (int64_t c = 0; c < k; ++c) {  // shrink: mid = x @ a_t, k ascending for every element
        const float* ac = g.at + c * r;
        float v[Q];
        for (int q = 0; q < Q; ++q) v[q] = static_cast<float>(xr[q][c]);
#pragma omp simd
        for (int64_t j = 0; j < r; ++j)
            for (int q = 0; q < Q; ++q) mid[q * r + j] += v[q] * ac[j];
    }
    for (int64_t c0 = c_begin; c0 < c_end; c0 += kColumns) {  // expand: y += mid @ bt, j ascending, rounded once
        const int64_t w = std::min(kColumns, c_end - c0);
        std::fill(acc, acc + Q * kColumns, 0.0f);
        for (int64_t j = 0; j < r; ++j) {
            float u[Q];
            for (int q = 0; q < Q; ++q) u[q] = mid[q * r + j];
            const float* bj = g.bt + j * n_out + c0;
#pragma omp simd
            for (int64_t c = 0; c < w; ++c)
                for (int q = 0; q < Q; ++q) acc[q * kColumns + c] += u[q] * bj[c];
        }
        for (int q = 0; q < Q; ++q)
            for (int64_t c = 0; c < w; ++c)
                yr[q][c0 + c] = vec::to<T>(static_cast<float>(yr[q][c0 + c]) + acc[q * kColumns + c]);
    }
}

template <typename T>
void run(const at::Tensor& x, at::Tensor& y, const std::vector<Group>& groups, int64_t max_r) {
    const int64_t k = x.size(1), n_out = y.size(1);
    const T* xp = x.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    struct Block {
        int32_t group;
        int64_t first, count;  // rows first.. of the group
    };
    std::vector<Block> blocks;
    for (size_t gi = 0; gi < groups.size(); ++gi)
        for (int64_t i = 0; i < groups[gi].n; i += kRows)
            blocks.push_back({static_cast<int32_t>(gi), i, std::min(kRows, groups[gi].n - i)});
    // Few blocks (a decode step's few rows): their columns split too, each part computing the block's shrink again,
    // so that both threads stream the adapter's weights.
    const int64_t parts = static_cast<int64_t>(blocks.size()) >= 4 ? 1
                          : std::max<int64_t>(1, std::min<int64_t>(4, n_out / kPartColumns));
    const int64_t part_cols = (n_out + parts - 1) / parts;
    // the weights an item reads: what makes a call worth more than one thread (the work is memory-bound)
    const int64_t item_bytes = std::max<int64_t>(1, max_r * (k + part_cols) * static_cast<int64_t>(sizeof(float)));
    parallel_for(0, static_cast<int64_t>(blocks.size()) * parts, (kMinBytes + item_bytes - 1) / item_bytes,
                 [&](int64_t b, int64_t e) {
        std::vector<float> mid(kRows * max_r), acc(kRows * kColumns);
        for (int64_t it = b; it < e; ++it) {
            const Block& blk = blocks[it / parts];
            const Group& g = groups[blk.group];
            const int64_t c_begin = (it % parts) * part_cols, c_end = std::min(n_out, c_begin + part_cols);
            const T* xr[kRows];
            T* yr[kRows];
            for (int64_t q = 0; q < blk.count; ++q) {
                const int64_t i = blk.first + q, row = g.rows ? g.rows[i] : i;
                xr[q] = xp + row * k;
                yr[q] = yp + row * n_out;
            }
            float* m = mid.data();
            float* a = acc.data();
            switch (blk.count) {
                case 1: rows_block<1>(g, xr, yr, k, n_out, c_begin, c_end, m, a); break;
                case 2: rows_block<2>(g, xr, yr, k, n_out, c_begin, c_end, m, a); break;
                case 3: rows_block<3>(g, xr, yr, k, n_out, c_begin, c_end, m, a); break;
                case 4: rows_block<4>(g, xr, yr, k, n_out, c_begin, c_end, m, a); break;
                case 5: rows_block<5>(g, xr, yr, k, n_out, c_begin, c_end, m, a); break;
                case 6: rows_block<6>(g, xr, yr, k, n_out, c_begin, c_end, m, a); break;
                case 7: rows_block<7>(g, xr, yr, k, n_out, c_begin, c_end, m, a); break;
                default: rows_block<8>(g, xr, yr, k, n_out, c_begin, c_end, m, a); break;
            }
        }
    });
}

}  // namespace

void lora_add_(at::Tensor& y, const at::Tensor& x, const c10::List<std::optional<at::Tensor>>& rows,
               const c10::List<at::Tensor>& a_t, const c10::List<at::Tensor>& bt) {
    TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && x.size(0) == y.size(0) && x.is_contiguous() && y.is_contiguous(),
                "lora_add_: x [T, K] and y [T, N], contiguous");
    TORCH_CHECK(x.scalar_type() == y.scalar_type() &&
                    (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
                "lora_add_: x and y both float32 or both bfloat16");
    TORCH_CHECK(rows.size() == a_t.size() && a_t.size() == bt.size(), "lora_add_: rows, a_t and bt per group");
    const int64_t tokens = x.size(0), k = x.size(1), n_out = y.size(1);
    std::vector<Group> groups;
    std::vector<at::Tensor> keep;
    std::vector<char> taken(tokens, 0);  // each row in one group at most: its output has one writer
    int64_t total = 0, max_r = 0;
    for (size_t gi = 0; gi < a_t.size(); ++gi) {
        const at::Tensor ag = a_t.get(gi), bg = bt.get(gi);
        TORCH_CHECK(ag.scalar_type() == at::kFloat && bg.scalar_type() == at::kFloat && ag.is_contiguous() &&
                        bg.is_contiguous() && ag.dim() == 2 && bg.dim() == 2 && ag.size(0) == k &&
                        bg.size(0) == ag.size(1) && bg.size(1) == n_out,
                    "lora_add_: a_t [K, r] and bt [r, N] contiguous float32 per group");
        Group g{nullptr, tokens, ag.size(1), ag.data_ptr<float>(), bg.data_ptr<float>()};
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
        total += g.n;
        max_r = std::max(max_r, g.r);
        groups.push_back(g);
    }
    if (total == 0) return;
    if (x.scalar_type() == at::kFloat) {
        run<float>(x, y, groups, max_r);
    } else {
        run<c10::BFloat16>(x, y, groups, max_r);
    }
}

}  // namespace rtp_llm
