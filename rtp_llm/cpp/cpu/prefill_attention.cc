// Causal attention for prefill rows on CPUs with AVX-512: sequence s has n_s new rows (its last n_s tokens),
// already written to the paged KV cache with the rest of its kv_len_s keys; row j sees keys
// [0, kv_len_s - n_s + j]. Keys and values are read through the block table, so fresh prompts, prompts after
// a cached prefix and chunked prefills of any lengths are one call (no gather into padded tensors, no mask).
//
// Why: the decode kernel takes one query row at a time and re-reads the keys and values per row; here a task
// (sequence, KV head, row block) scores all its rows' query vectors against keys that stay in L1/L2 (8 keys x
// 3 query vectors per pass), then multiplies probabilities and values as a small GEMM (64 columns x 6 query
// vectors per pass).
//
// Summation order: scores and softmax are the decode kernel's own functions (paged_attention_avx512.cc: a
// score in 16 lanes over head_dim then reduce1's tree; the softmax's sum in 16 lanes then the same tree), and
// an output column sums keys in order, as the decode kernel does. So a row's result is bit for bit what the
// decode kernel gives it, and depends only on its own sequence: not on the row blocking, the thread split,
// other sequences in the call, the prefill chunk it came in or whether its prefix was cached.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/paged_rows.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include "rtp_llm/cpp/cpu/vec/avx512.h"

namespace rtp_llm {
namespace {

using avx512::load16;

constexpr int kQueryTile = 6;  // query vectors per values pass: 6 x 4 vectors = 24 accumulators
constexpr int kKeyVecs = 4;    // 64 columns per values pass
// Rows per task: the task's scores ([rows x group, keys] floats) stay within this many bytes (in L2).
constexpr int64_t kScoreBytes = 256 << 10;

// o[i][col : col + 16 NC] = sum_{t < keys} p[i][t] v_t[col : ...] for NQ query vectors.
template <int NQ, int NC, typename T>
RTP_AVX512 void value_block(const float* p, int64_t lds, const SeqRows<T>& values, int64_t offset, int64_t keys,
                            int64_t col, float* o, int64_t dim) {
    __m512 acc[NQ][NC];
    for (int i = 0; i < NQ; ++i)
        for (int c = 0; c < NC; ++c) acc[i][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < keys; ++t) {
        const T* row = values(t) + offset + col;
        __m512 v[NC];
        for (int c = 0; c < NC; ++c) v[c] = load16(row + 16 * c);
        for (int i = 0; i < NQ; ++i) {
            const __m512 b = _mm512_set1_ps(p[i * lds + t]);
            for (int c = 0; c < NC; ++c) acc[i][c] = _mm512_fmadd_ps(b, v[c], acc[i][c]);
        }
    }
    for (int i = 0; i < NQ; ++i)
        for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + i * dim + col + 16 * c, acc[i][c]);
}

template <int NQ, typename T>
RTP_AVX512 void value_rows(const float* p, int64_t lds, const SeqRows<T>& values, int64_t offset, int64_t keys,
                           float* o, int64_t dim) {
    int64_t c = 0;
    for (; c + 16 * kKeyVecs <= dim; c += 16 * kKeyVecs) value_block<NQ, kKeyVecs>(p, lds, values, offset, keys, c, o, dim);
    for (; c < dim; c += 16) value_block<NQ, 1>(p, lds, values, offset, keys, c, o, dim);
}

template <typename T>
void value_rows_any(int nq, const float* p, int64_t lds, const SeqRows<T>& values, int64_t offset, int64_t keys,
                    float* o, int64_t dim) {
    switch (nq) {
        case 6: value_rows<6>(p, lds, values, offset, keys, o, dim); break;
        case 5: value_rows<5>(p, lds, values, offset, keys, o, dim); break;
        case 4: value_rows<4>(p, lds, values, offset, keys, o, dim); break;
        case 3: value_rows<3>(p, lds, values, offset, keys, o, dim); break;
        case 2: value_rows<2>(p, lds, values, offset, keys, o, dim); break;
        default: value_rows<1>(p, lds, values, offset, keys, o, dim); break;
    }
}

// dst[0, dim) = src * scale in float32.
template <typename T>
RTP_AVX512 void scaled_row(const T* src, float scale, int64_t dim, float* dst) {
    const __m512 m = _mm512_set1_ps(scale);
    for (int64_t d = 0; d < dim; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(load16(src + d), m));
}

struct Task {
    int64_t seq, group, r0, r1, cost;
};

template <typename T>
void prefill_kernel(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                    const at::Tensor& block_table, const std::vector<int64_t>& starts,
                    const std::vector<int64_t>& kv_lens, double scale, at::Tensor& out) {
    const int64_t seqs = static_cast<int64_t>(kv_lens.size()), heads = q.size(1), dim = q.size(2);
    const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), group = heads / kv_heads;
    const int64_t table_width = block_table.size(1), token_stride = kv_heads * dim, q_stride = q.stride(0);
    const T* qp = q.data_ptr<T>();
    const T* kp = k_cache.data_ptr<T>();
    const T* vp = v_cache.data_ptr<T>();
    const int32_t* bt = block_table.data_ptr<int32_t>();
    T* op = out.data_ptr<T>();

    std::vector<int64_t> padded(seqs);  // score rows' stride: keys rounded up to 16
    for (int64_t s = 0; s < seqs; ++s) padded[s] = (kv_lens[s] + 15) / 16 * 16;

    // Tasks of (sequence, KV head, row block), the costliest first, claimed by the threads in chunks.
    std::vector<Task> tasks;
    for (int64_t s = 0; s < seqs; ++s) {
        const int64_t n = starts[s + 1] - starts[s], ctx = kv_lens[s] - n;
        const int64_t rows = std::clamp<int64_t>(kScoreBytes / (4 * group * padded[s]), 1, 64);
        for (int64_t r0 = 0; r0 < n; r0 += rows)
            for (int64_t g = 0; g < kv_heads; ++g) {
                const int64_t r1 = std::min(n, r0 + rows);
                tasks.push_back({s, g, r0, r1, (r1 - r0) * (ctx + r1)});
            }
    }
    std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
    parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t tbegin, int64_t tend) {
        std::vector<float> qs, sc, o;
        for (int64_t ti = tbegin; ti < tend; ++ti) {
            const Task& task = tasks[ti];
            const int64_t s = task.seq, g = task.group, n = starts[s + 1] - starts[s], ctx = kv_lens[s] - n;
            const int64_t nq = (task.r1 - task.r0) * group, lds = padded[s];
            const SeqRows<T> keys{kp, bt + s * table_width, block_size, token_stride};
            const SeqRows<T> values{vp, bt + s * table_width, block_size, token_stride};
            qs.resize(nq * dim), sc.resize(nq * lds), o.resize(nq * dim);
            // The task's queries, scaled, vector i = (row r0 + i / group, query head g * group + i % group).
            for (int64_t i = 0; i < nq; ++i)
                scaled_row(qp + (starts[s] + task.r0 + i / group) * q_stride + (g * group + i % group) * dim,
                           static_cast<float>(scale), dim, qs.data() + i * dim);
            // A vector's row sees ctx + row + 1 keys; a pass covers what its last vector sees.
            const auto keys_of = [&](int64_t i) { return ctx + task.r0 + i / group + 1; };
            for (int64_t i0 = 0; i0 < nq; i0 += kQueryTile) {
                const int nt = static_cast<int>(std::min<int64_t>(kQueryTile, nq - i0));
                const int64_t n_keys = keys_of(i0 + nt - 1);
                query_scores_avx512(keys, g, qs.data() + i0 * dim, nt, dim, n_keys, sc.data() + i0 * lds, lds);
                for (int64_t i = i0; i < i0 + nt; ++i) softmax_row_avx512(sc.data() + i * lds, keys_of(i), n_keys);
                value_rows_any<T>(nt, sc.data() + i0 * lds, lds, values, g * dim, n_keys, o.data() + i0 * dim,
                                  dim);
            }
            for (int64_t i = 0; i < nq; ++i) {
                T* dst = op + ((starts[s] + task.r0 + i / group) * heads + g * group + i % group) * dim;
                if constexpr (std::is_same_v<T, float>) {
                    std::memcpy(dst, o.data() + i * dim, dim * sizeof(float));
                } else {
                    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(o[i * dim + d]);
                }
            }
        }
    });
}

}  // namespace
}  // namespace rtp_llm
#endif

namespace rtp_llm {

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_table, const at::Tensor& q_starts, const at::Tensor& kv_lens,
                             double scale) {
    TORCH_CHECK(cpu_avx512(), "prefill_attention: needs a CPU with AVX-512");
    TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "prefill_attention: CPU tensors only");
    TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2),
                "prefill_attention: q must be [tokens, heads, head_dim] with contiguous rows, got ", q.sizes());
    TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() && k_cache.is_contiguous() &&
                    v_cache.is_contiguous(),
                "prefill_attention: k_cache/v_cache must be contiguous [num_blocks, block_size, kv_heads, head_dim]");
    TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type() &&
                    (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
                "prefill_attention: q and the caches must share a dtype, float32 or bfloat16");
    TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(2) % 16 == 0, "prefill_attention: head_dim ", q.size(2),
                " must match the cache's and be a multiple of 16");
    TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "prefill_attention: query heads must be a multiple of kv heads");
    TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.is_contiguous(),
                "prefill_attention: block_table must be contiguous int32 [sequences, max_blocks]");
    const int64_t seqs = block_table.size(0);
    TORCH_CHECK(q_starts.dim() == 1 && q_starts.size(0) == seqs + 1 && kv_lens.dim() == 1 && kv_lens.size(0) == seqs,
                "prefill_attention: q_starts must be [sequences + 1] and kv_lens [sequences]");
    auto st = q_starts.to(at::kLong).contiguous(), kl = kv_lens.to(at::kLong).contiguous();
    std::vector<int64_t> starts(st.data_ptr<int64_t>(), st.data_ptr<int64_t>() + seqs + 1);
    std::vector<int64_t> lens(kl.data_ptr<int64_t>(), kl.data_ptr<int64_t>() + seqs);
    const int64_t capacity = block_table.size(1) * k_cache.size(1);
    TORCH_CHECK(starts[0] == 0 && starts[seqs] == q.size(0), "prefill_attention: q_starts must run from 0 to ",
                q.size(0));
    for (int64_t s = 0; s < seqs; ++s) {
        const int64_t n = starts[s + 1] - starts[s];
        TORCH_CHECK(n >= 0 && lens[s] >= n && lens[s] <= capacity, "prefill_attention: sequence ", s, " has ", n,
                    " rows and kv_len ", lens[s], " (capacity ", capacity, ")");
    }
    auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
#if defined(__x86_64__) && defined(__GNUC__)
    if (q.scalar_type() == at::kFloat)
        prefill_kernel<float>(q, k_cache, v_cache, block_table, starts, lens, scale, out);
    else
        prefill_kernel<at::BFloat16>(q, k_cache, v_cache, block_table, starts, lens, scale, out);
#endif
    return out;
}

}  // namespace rtp_llm
