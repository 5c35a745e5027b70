// Paged attention on CPU: one query row per entry (a decode, or a row of a short chunk) attends over its cached
// keys, read in place through the block table from the layer's [num_blocks, block_size, kv_heads, head_dim]
// views.
//
// Why a kernel: the reference path gathers every sequence's K and V into padded temporaries and runs
// masked SDPA with the KV heads expanded, reading the cache twice and writing it once per layer per
// step. Here each sequence's task reads its keys and values once, for all query heads (GQA groups
// share their KV head's row), with a float32 softmax. Tasks run in parallel (work_pool.h); a long sequence with
// threads to spare, or longer than a thread's share of the call, has its keys, softmax rows and value columns
// split across the threads instead (long_sequence), which gives the same bits.
// The AVX2 path scores eight keys per pass, uses a vectorised exp, keeps the value accumulators in
// registers over 16-token tiles and prefetches rows into L2 (benchmarks.cpu_decode_attention measures it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"
#include "rtp_llm/cpp/cpu/paged_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace rtp_llm {
namespace {

#ifdef __AVX2__
// scores[h * len + j] = q_h . k_j for the query heads [h0, h1) of the KV heads [g0, g1), eight keys at a
// time (eight accumulators, one hsum8), keys read in place; q already scaled, float32.
template <typename T>
void scores_avx2(const SeqRows<T>& keys, const float* qf, int64_t len, int64_t dim, int64_t group, int64_t g0,
                 int64_t g1, float* scores) {
    const int64_t row_bytes = keys.token_stride * sizeof(T);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
        const T* r[8];
        for (int t = 0; t < 8; ++t) r[t] = keys(j + t);
        for (int64_t t = j + kAheadTokens; t < std::min(len, j + kAheadTokens + 8); ++t) prefetch_row(keys(t), row_bytes);
        for (int64_t g = g0; g < g1; ++g) {
            for (int64_t h = g * group; h < (g + 1) * group; ++h) {
                __m256 acc[8];
                for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
                for (int64_t d = 0; d < dim; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(qf + h * dim + d);
                    for (int t = 0; t < 8; ++t) acc[t] = _mm256_fmadd_ps(vec::load8(r[t] + g * dim + d), qv, acc[t]);
                }
                _mm256_storeu_ps(scores + h * len + j, vec::hsum8(acc));
            }
        }
    }
    for (; j < len; ++j) {
        const T* r = keys(j);
        for (int64_t h = g0 * group; h < g1 * group; ++h) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t d = 0; d < dim; d += 8)
                acc = _mm256_fmadd_ps(vec::load8(r + (h / group) * dim + d), _mm256_loadu_ps(qf + h * dim + d), acc);
            scores[h * len + j] = vec::hsum(acc);
        }
    }
}

// s[0, n) = softmax(s) in place.
inline void softmax_avx2(float* s, int64_t n) {
    __m256 mx8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(s + i));
    float tmp[8];
    _mm256_storeu_ps(tmp, mx8);
    float mx = *std::max_element(tmp, tmp + 8);
    for (; i < n; ++i) mx = std::max(mx, s[i]);
    const __m256 m = _mm256_set1_ps(mx);
    __m256 sum8 = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = vec::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
        _mm256_storeu_ps(s + i, e);
        sum8 = _mm256_add_ps(sum8, e);
    }
    float sum = vec::hsum(sum8);
    for (; i < n; ++i) sum += (s[i] = std::exp(s[i] - mx));
    const __m256 inv = _mm256_set1_ps(1.f / sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), inv));
    for (; i < n; ++i) s[i] *= 1.f / sum;
}

// acc[h][c : c + 8 COLS] += sum over the tile's tokens of p[h, t] * v_t[...] for NH query heads of one KV
// head. The NH x COLS accumulators stay in registers across the tile (instead of a load and a store per
// token), and there are 8-12 of them: independent FMA chains enough to cover the FMA latency.
template <int NH, int COLS, typename T>
inline void pv_tile(const T* const* rows, int64_t n, int64_t col, const float* probs, int64_t len, float* acc,
                    int64_t dim) {
    __m256 a[NH][COLS];
    for (int i = 0; i < NH; ++i)
        for (int c = 0; c < COLS; ++c) a[i][c] = _mm256_loadu_ps(acc + i * dim + col + 8 * c);
    for (int64_t t = 0; t < n; ++t) {
        __m256 v[COLS];
        for (int c = 0; c < COLS; ++c) v[c] = vec::load8(rows[t] + col + 8 * c);
        for (int i = 0; i < NH; ++i) {
            const __m256 p = _mm256_broadcast_ss(probs + i * len + t);
            for (int c = 0; c < COLS; ++c) a[i][c] = _mm256_fmadd_ps(p, v[c], a[i][c]);
        }
    }
    for (int i = 0; i < NH; ++i)
        for (int c = 0; c < COLS; ++c) _mm256_storeu_ps(acc + i * dim + col + 8 * c, a[i][c]);
}

// Up to 4 query heads of one KV head over all columns, in column strips of 8 * COLS.
template <int NH, typename T>
inline void pv_heads(const T* const* rows, int64_t n, const float* probs, int64_t len, float* acc, int64_t dim) {
    constexpr int kCols = NH == 1 ? 8 : NH == 4 ? 2 : 4;  // 8-12 accumulators
    int64_t c = 0;
    for (; c + 8 * kCols <= dim; c += 8 * kCols) pv_tile<NH, kCols>(rows, n, c, probs, len, acc, dim);
    for (; c < dim; c += 8) pv_tile<NH, 1>(rows, n, c, probs, len, acc, dim);
}

// acc[h] = sum_t p[h, t] v_t for the query heads of [g0, g1), in tiles of 16 tokens whose rows stay in L1
// while every (KV head, column strip) pass runs over them; the next tile's rows are prefetched meanwhile.
template <typename T>
void weighted_values_avx2(const SeqRows<T>& values, const float* probs, int64_t len, int64_t dim, int64_t group,
                          int64_t g0, int64_t g1, float* acc) {
    std::fill(acc + g0 * group * dim, acc + g1 * group * dim, 0.f);
    const T* head_rows[kValueTile];
    for_each_value_tile(values, len, g0, g1, [&](const T* const* rows, int64_t n, int64_t t0, int64_t g) {
        for (int64_t t = 0; t < n; ++t) head_rows[t] = rows[t] + g * dim;
        for (int64_t h = g * group; h < (g + 1) * group; h += 4) {
            const float* p = probs + h * len + t0;
            float* a = acc + h * dim;
            switch (std::min<int64_t>(4, (g + 1) * group - h)) {
                case 4: pv_heads<4>(head_rows, n, p, len, a, dim); break;
                case 3: pv_heads<3>(head_rows, n, p, len, a, dim); break;
                case 2: pv_heads<2>(head_rows, n, p, len, a, dim); break;
                default: pv_heads<1>(head_rows, n, p, len, a, dim); break;
            }
        }
    });
}
#endif

// The portable path (no AVX2, or a head_dim that is not a multiple of 8).
template <typename T>
void attend_scalar(const SeqRows<T>& keys, const SeqRows<T>& values, const float* qf, int64_t len, int64_t dim,
                   int64_t group, int64_t g0, int64_t g1, float* scores, float* acc) {
    const int64_t h0 = g0 * group, h1 = g1 * group;
    for (int64_t j = 0; j < len; ++j) {
        const T* r = keys(j);
        for (int64_t h = h0; h < h1; ++h) scores[h * len + j] = vec::dot(r + (h / group) * dim, qf + h * dim, dim);
    }
    for (int64_t h = h0; h < h1; ++h) {
        float* s = scores + h * len;
        const float mx = *std::max_element(s, s + len);
        float sum = 0.f;
        for (int64_t i = 0; i < len; ++i) sum += (s[i] = std::exp(s[i] - mx));
        for (int64_t i = 0; i < len; ++i) s[i] /= sum;
    }
    std::fill(acc + h0 * dim, acc + h1 * dim, 0.f);
    for (int64_t t = 0; t < len; ++t) {
        const T* r = values(t);
        for (int64_t h = h0; h < h1; ++h) {
            const T* val = r + (h / group) * dim;
            const float p = scores[h * len + t];
            float* a = acc + h * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) a[d] += p * static_cast<float>(val[d]);
        }
    }
}

#ifdef __AVX2__
// The keys of one long sequence per parallel range, the unit a multiple of the scores' 8-key groups.
constexpr int64_t kKeyRange = 64;
// From this many keys on, a sequence with threads to spare, or with more than a thread's share of the keys, runs
// long_sequence (benchmarks.cpu_decode_attention --batch 1, benchmarks/README.md).
constexpr int64_t kSplitKeys = 128;

// Sequence b of decode_kernel's batch in three parallel loops (see there).
template <typename T>
void long_sequence(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const at::Tensor& block_table, int64_t b, int64_t len, double scale, at::Tensor& out) {
    const int64_t heads = q.size(1), dim = q.size(2), block_size = k_cache.size(1), kv_heads = k_cache.size(2);
    const int64_t group = heads / kv_heads, token_stride = kv_heads * dim;
    const T* qp = q.data_ptr<T>() + b * q.stride(0);
    const int32_t* bt = block_table.data_ptr<int32_t>() + b * block_table.size(1);
    std::vector<float> qf(heads * dim), scores(heads * len), acc(heads * dim);
    const float fscale = static_cast<float>(scale);  // as decode_kernel scales
    for (int64_t i = 0; i < heads * dim; ++i) qf[i] = static_cast<float>(qp[i]) * fscale;
    const SeqRows<T> keys{k_cache.data_ptr<T>(), bt, block_size, token_stride};
    const SeqRows<T> values{v_cache.data_ptr<T>(), bt, block_size, token_stride};
    parallel_for(0, (len + kKeyRange - 1) / kKeyRange, 1, [&](int64_t r0, int64_t r1) {
        attention_key_range_avx512(keys, qf.data(), len, dim, group, kv_heads, r0 * kKeyRange,
                                   std::min(len, r1 * kKeyRange), scores.data());
    });
    parallel_for(0, heads, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) softmax_row_avx512(&scores[h * len], len, len);
    });
    const int64_t strips = token_stride / 16, parts = std::min<int64_t>(at::get_num_threads(), strips);
    parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
            attention_value_columns_avx512(values, scores.data(), len, dim, group, 16 * (strips * p / parts),
                                           16 * (strips * (p + 1) / parts), acc.data());
    });
    T* op = out.data_ptr<T>() + b * heads * dim;
    for (int64_t i = 0; i < heads * dim; ++i) op[i] = static_cast<T>(acc[i]);
}
#endif

template <typename T>
void decode_kernel(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const at::Tensor& block_table, const std::vector<int64_t>& kv_lens, double scale, at::Tensor& out) {
    const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
    const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
    const int64_t group = heads / kv_heads, table_width = block_table.size(1), q_row = q.stride(0);
    const T* qp = q.data_ptr<T>();
    const int32_t* bt = block_table.data_ptr<int32_t>();
    T* op = out.data_ptr<T>();
    const int64_t token_stride = kv_heads * dim;  // one token's row: every KV head, contiguous
#ifdef __AVX2__
    const bool vectorised = dim % 8 == 0;
    // float32 / bf16 caches on a CPU with AVX-512 (paged_attention_avx512.cc: half the instructions per key).
    const bool wide = (std::is_same_v<T, float> || std::is_same_v<T, at::BFloat16>) && dim % 16 == 0 &&
                      cpu_avx512();
#endif

    // A sequence longer than a thread's share of the call's keys (batch 1 on a long context; a long chat beside
    // short ones) runs alone first, in three loops over every thread: its keys in ranges of whole rows, the softmax
    // rows, its values' columns in one contiguous range per thread. Left to one task (below) it would keep one
    // thread busy after the others finish, and split by KV heads it leaves a thread idle when they do not divide
    // among the threads (SmolLM2's 3 on 2), each task reading a strided third of every row. The same bits either
    // way: every score, softmax row and value column is computed whole, in its fixed order.
    const int64_t threads = at::get_num_threads();
    std::vector<int64_t> rest;  // the sequences for the tasks below
    rest.reserve(batch);
    int64_t total = 0;
    for (int64_t len : kv_lens) total += len;
    for (int64_t b = 0; b < batch; ++b) {
        bool alone = false;
#ifdef __AVX2__
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, at::BFloat16>) {
            alone = wide && threads > 1 && kv_lens[b] >= kSplitKeys &&
                    (batch < threads || kv_lens[b] * threads > total);
            if (alone) long_sequence<T>(q, k_cache, v_cache, block_table, b, kv_lens[b], scale, out);
        }
#endif
        if (!alone) rest.push_back(b);
    }
    const int64_t tasks = static_cast<int64_t>(rest.size());
    // One task per sequence, tokens in the outer loop and KV heads inside: each token's whole row is
    // read once, in address order within a block (per-(sequence, KV head) tasks hop across rows and were
    // slower). With fewer sequences than threads, tasks split the KV heads again so every thread has work.
    const int64_t splits = tasks >= threads ? 1 : kv_heads;
    const int64_t heads_per_split = kv_heads / splits;
    parallel_for(0, tasks * splits, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scores, qf(heads * dim), acc(heads * dim);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t b = rest[task / splits], g0 = (task % splits) * heads_per_split, g1 = g0 + heads_per_split;
            const int64_t h0 = g0 * group, h1 = g1 * group;
            const int64_t len = kv_lens[b];
            scores.resize(heads * len);
            // Scaled in float32, as the prefill kernel scales its queries (a double product rounds differently).
            const float fscale = static_cast<float>(scale);
            for (int64_t i = h0 * dim; i < h1 * dim; ++i) qf[i] = static_cast<float>(qp[b * q_row + i]) * fscale;
            const SeqRows<T> keys{k_cache.data_ptr<T>(), bt + b * table_width, block_size, token_stride};
            const SeqRows<T> values{v_cache.data_ptr<T>(), bt + b * table_width, block_size, token_stride};
#ifdef __AVX2__
            if constexpr (std::is_same_v<T, float> || std::is_same_v<T, at::BFloat16>) {
                if (wide) {
                    const int64_t with_keys = values_with_keys(len, token_stride * sizeof(T));
                    attention_scores_avx512(keys, values, with_keys, qf.data(), len, dim, group, g0, g1,
                                            scores.data());
                    for (int64_t h = h0; h < h1; ++h) softmax_row_avx512(&scores[h * len], len, len);
                    attention_values_avx512(values, scores.data(), len, dim, group, g0, g1, acc.data());
                    for (int64_t i = h0 * dim; i < h1 * dim; ++i) op[b * heads * dim + i] = static_cast<T>(acc[i]);
                    continue;
                }
            }
            if (vectorised) {
                scores_avx2(keys, qf.data(), len, dim, group, g0, g1, scores.data());
                for (int64_t h = h0; h < h1; ++h) softmax_avx2(&scores[h * len], len);
                weighted_values_avx2(values, scores.data(), len, dim, group, g0, g1, acc.data());
            } else
#endif
                attend_scalar(keys, values, qf.data(), len, dim, group, g0, g1, scores.data(), acc.data());
            for (int64_t i = h0 * dim; i < h1 * dim; ++i) op[b * heads * dim + i] = static_cast<T>(acc[i]);
        }
    });
}

}  // namespace

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_table, const at::Tensor& kv_lens, double scale) {
    TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "paged_attention: CPU tensors only");
    TORCH_CHECK(q.dim() == 3, "q must be [batch, heads, head_dim], got ", q.sizes());
    TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
                "k_cache/v_cache must be [num_blocks, block_size, kv_heads, head_dim] and equal");
    // q's rows may be apart (decoder_layers passes q as a column slice of qkv), each row's heads contiguous.
    TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && k_cache.is_contiguous() && v_cache.is_contiguous(),
                "inputs must be contiguous (q: each row's heads)");
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
    auto out = at::empty(q.sizes(), q.options());  // contiguous, whatever q's row stride
    if (q.scalar_type() == at::kFloat) {
        decode_kernel<float>(q, k_cache, v_cache, block_table, lens, scale, out);
    } else if (q.scalar_type() == at::kBFloat16) {
        decode_kernel<at::BFloat16>(q, k_cache, v_cache, block_table, lens, scale, out);
    } else if (q.scalar_type() == at::kHalf) {
        decode_kernel<at::Half>(q, k_cache, v_cache, block_table, lens, scale, out);
    } else {
        TORCH_CHECK(false, "paged_attention: unsupported dtype ", q.scalar_type());
    }
    return out;
}

}  // namespace rtp_llm
