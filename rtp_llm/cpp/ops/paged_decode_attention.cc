// Paged decode attention on CPU: one new token per sequence attends over its cached keys, read in
// place through the block table from the layer's [num_blocks, block_size, kv_heads, head_dim] views.
//
// Why a kernel: the reference path gathers every sequence's K and V into padded temporaries and runs
// masked SDPA with the KV heads expanded, reading the cache twice and writing it once per layer per
// step. Here each sequence's task reads its keys and values once, for all query heads (GQA groups
// share their KV head's row), with a float32 softmax. Tasks run in parallel with at::parallel_for.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace rtp_llm {
namespace {

template <typename T>
inline float dot(const T* a, const float* b, int64_t n) {
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += static_cast<float>(a[i]) * b[i];
    return acc;
}

// One query row against four keys: four independent accumulator chains instead of one, so the FMA
// latency is hidden (a single 64-element dot is latency-bound, about a third of the FMA throughput).
template <typename T>
inline void dot4(const T* k0, const T* k1, const T* k2, const T* k3, const float* q, int64_t n, float* out) {
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int64_t i = 0; i < n; ++i) {
        const float qi = q[i];
        a0 += static_cast<float>(k0[i]) * qi;
        a1 += static_cast<float>(k1[i]) * qi;
        a2 += static_cast<float>(k2[i]) * qi;
        a3 += static_cast<float>(k3[i]) * qi;
    }
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
}

template <typename T>
void decode_kernel(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const at::Tensor& block_table, const std::vector<int64_t>& kv_lens, double scale, at::Tensor& out) {
    const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
    const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
    const int64_t group = heads / kv_heads, table_width = block_table.size(1);
    const T* qp = q.data_ptr<T>();
    const T* kp = k_cache.data_ptr<T>();
    const T* vp = v_cache.data_ptr<T>();
    const int32_t* bt = block_table.data_ptr<int32_t>();
    T* op = out.data_ptr<T>();
    const int64_t token_stride = kv_heads * dim;  // one token's row: every KV head, contiguous

    // One task per sequence, tokens in the outer loop and KV heads inside: each token's whole row is
    // read once, in address order within a block, which keeps the prefetchers streaming when the
    // cache is cold (per-(sequence, KV head) tasks hop across rows: ~1.4x slower on a batch of 32).
    // With fewer sequences than threads, tasks split the KV heads again so every thread has work.
    const int64_t splits = batch >= at::get_num_threads() ? 1 : kv_heads;
    const int64_t heads_per_split = kv_heads / splits;
    at::parallel_for(0, batch * splits, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scores, qf(heads * dim), acc(heads * dim);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t b = task / splits, g0 = (task % splits) * heads_per_split, g1 = g0 + heads_per_split;
            const int64_t h0 = g0 * group, h1 = g1 * group;
            const int64_t len = kv_lens[b];
            scores.resize(heads * len);
            for (int64_t i = h0 * dim; i < h1 * dim; ++i) qf[i] = static_cast<float>(qp[b * heads * dim + i]) * scale;
            auto row = [&](const T* base, int64_t j) {
                const int64_t slot = static_cast<int64_t>(bt[b * table_width + j / block_size]) * block_size +
                                     j % block_size;
                return base + slot * token_stride;
            };
            int64_t j = 0;
            float four[4];
            for (; j + 4 <= len; j += 4) {
                const T *r0 = row(kp, j), *r1 = row(kp, j + 1), *r2 = row(kp, j + 2), *r3 = row(kp, j + 3);
                for (int64_t g = g0; g < g1; ++g) {
                    const int64_t o = g * dim;
                    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
                        dot4(r0 + o, r1 + o, r2 + o, r3 + o, &qf[h * dim], dim, four);
                        std::copy(four, four + 4, &scores[h * len + j]);
                    }
                }
            }
            for (; j < len; ++j) {
                const T* r = row(kp, j);
                for (int64_t h = h0; h < h1; ++h) scores[h * len + j] = dot(r + (h / group) * dim, &qf[h * dim], dim);
            }
            for (int64_t h = h0; h < h1; ++h) {
                float* s = &scores[h * len];
                const float mx = *std::max_element(s, s + len);
                float sum = 0.f;
                for (int64_t i = 0; i < len; ++i) sum += (s[i] = std::exp(s[i] - mx));
                const float inv = 1.f / sum;
                for (int64_t i = 0; i < len; ++i) s[i] *= inv;
            }
            std::fill(acc.begin() + h0 * dim, acc.begin() + h1 * dim, 0.f);
            for (int64_t t = 0; t < len; ++t) {
                const T* r = row(vp, t);
                for (int64_t h = h0; h < h1; ++h) {
                    const T* val = r + (h / group) * dim;
                    const float p = scores[h * len + t];
                    float* a = &acc[h * dim];
#pragma omp simd
                    for (int64_t d = 0; d < dim; ++d) a[d] += p * static_cast<float>(val[d]);
                }
            }
            for (int64_t i = h0 * dim; i < h1 * dim; ++i) op[b * heads * dim + i] = static_cast<T>(acc[i]);
        }
    });
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_table, const at::Tensor& kv_lens, double scale) {
    TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "paged_decode_attention: CPU tensors only");
    TORCH_CHECK(q.dim() == 3, "q must be [batch, heads, head_dim], got ", q.sizes());
    TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
                "k_cache/v_cache must be [num_blocks, block_size, kv_heads, head_dim] and equal");
    TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "inputs must be contiguous");
    TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
                "q and the caches must share a dtype");
    TORCH_CHECK(q.size(2) == k_cache.size(3), "head_dim differs between q and the cache");
    TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of kv heads");
    TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.is_contiguous() &&
                    block_table.size(0) >= q.size(0),
                "block_table must be contiguous int32 [batch, max_blocks]");
    TORCH_CHECK(kv_lens.dim() == 1 && kv_lens.size(0) == q.size(0), "kv_lens must be [batch]");
    auto lens_t = kv_lens.to(at::kLong).contiguous();
    std::vector<int64_t> lens(lens_t.data_ptr<int64_t>(), lens_t.data_ptr<int64_t>() + lens_t.numel());
    const int64_t capacity = block_table.size(1) * k_cache.size(1);
    for (int64_t b = 0; b < static_cast<int64_t>(lens.size()); ++b) {
        TORCH_CHECK(lens[b] >= 1 && lens[b] <= capacity, "kv_lens[", b, "]=", lens[b], " outside [1, ", capacity, "]");
    }
    auto out = at::empty_like(q);
    if (q.scalar_type() == at::kFloat) {
        decode_kernel<float>(q, k_cache, v_cache, block_table, lens, scale, out);
    } else if (q.scalar_type() == at::kBFloat16) {
        decode_kernel<at::BFloat16>(q, k_cache, v_cache, block_table, lens, scale, out);
    } else if (q.scalar_type() == at::kHalf) {
        decode_kernel<at::Half>(q, k_cache, v_cache, block_table, lens, scale, out);
    } else {
        TORCH_CHECK(false, "paged_decode_attention: unsupported dtype ", q.scalar_type());
    }
    return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rtp_llm, m) {
    m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor kv_lens, "
          "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(rtp_llm, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }

}  // namespace rtp_llm
