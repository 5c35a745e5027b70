// A sequence's cached rows read in place through its block table, and their prefetch: shared by the paged
// decode-attention kernels (paged_attention.cc, paged_attention_avx512.cc).
#pragma once

#include <cstdint>

namespace rtp_llm {

// Block sizes are powers of two in practice (16 on CPU): a shift and a mask, not a 64-bit division per
// token, which alone cost about as much as the token's arithmetic.
template <typename T>
struct SeqRows {
    const T* base;
    const int32_t* table;  // this sequence's block ids
    int64_t block_size, token_stride;
    int shift = -1;        // log2(block_size) when it is a power of two

    SeqRows(const T* base_, const int32_t* table_, int64_t block_size_, int64_t token_stride_)
        : base(base_), table(table_), block_size(block_size_), token_stride(token_stride_) {
        if ((block_size & (block_size - 1)) == 0) shift = __builtin_ctzll(static_cast<unsigned long long>(block_size));
    }
    const T* operator()(int64_t j) const {
        const int64_t blk = shift >= 0 ? j >> shift : j / block_size;
        const int64_t off = shift >= 0 ? j & (block_size - 1) : j % block_size;
        return base + (static_cast<int64_t>(table[blk]) * block_size + off) * token_stride;
    }
};

// The prefetch distance in tokens: far enough to cover memory latency at the rate a core consumes rows,
// near enough that the lines are still in L1/L2 when used. Cached blocks are scattered, so the hardware
// stream prefetchers restart at every block boundary; explicit prefetches keep the lines in flight.
constexpr int64_t kAheadTokens = 8;

// Into L2 (prefetcht1), not L1: L1-targeted prefetches stall the core once its L1 miss buffers fill, while
// L2-targeted ones keep streaming.
template <typename T>
inline void prefetch_row(const T* row, int64_t bytes) {
    const char* p = reinterpret_cast<const char*>(row);
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
}

// The values the AVX-512 scores pass requests into L2 beside their keys, as many tokens as fit this many bytes
// (L2 is 1-2 MiB per core on the CPUs this runs on): memory then streams K and V at once, twice the lines in
// flight (benchmarks/README.md). A longer sequence's later values are left to the values pass, so that none is
// evicted before its use.
constexpr int64_t kValuesWithKeysBytes = 256 * 1024;

inline int64_t values_with_keys(int64_t len, int64_t row_bytes) {
    const int64_t fit = kValuesWithKeysBytes / row_bytes;
    return len < fit ? len : fit;
}

// The values pass's walk over a sequence, shared by both kernels: tiles of kValueTile tokens whose rows
// stay in L1 while every KV head's pass runs over them, the next tile's rows prefetched meanwhile (also when
// the scores pass requested them: under load some requests are dropped, and asking again was faster).
// fn(rows, n, t0, g) per tile and KV head g in [g0, g1); rows[t] points at token t0 + t's row (head g's values
// start g * head_dim further), looked up once per tile.
constexpr int64_t kValueTile = 16;

template <typename T, typename Fn>
inline void for_each_value_tile(const SeqRows<T>& values, int64_t len, int64_t g0, int64_t g1, Fn&& fn) {
    const int64_t row_bytes = values.token_stride * sizeof(T);
    const T* rows[kValueTile];
    for (int64_t t0 = 0; t0 < len; t0 += kValueTile) {
        const int64_t n = len - t0 < kValueTile ? len - t0 : kValueTile;
        for (int64_t t = t0 + kValueTile; t < len && t < t0 + 2 * kValueTile; ++t) prefetch_row(values(t), row_bytes);
        for (int64_t t = 0; t < n; ++t) rows[t] = values(t0 + t);
        for (int64_t g = g0; g < g1; ++g) fn(static_cast<const T* const*>(rows), n, t0, g);
    }
}

// The AVX-512 halves of the paged attention kernel (paged_attention_avx512.cc), used by paged_attention.cc for
// one sequence's task when the CPU has AVX-512 and head_dim % 16 == 0.
// scores[h * len + j] = q_h . k_j for the query heads of KV heads [g0, g1) (group query heads each), every key
// j < len read in place; qf: float32 queries, already scaled. The rows of values(t), t < with_values, are
// requested into L2 as the keys are read (values_with_keys).
template <typename T>
void attention_scores_avx512(const SeqRows<T>& keys, const SeqRows<T>& values, int64_t with_values, const float* qf,
                             int64_t len, int64_t dim, int64_t group, int64_t g0, int64_t g1, float* scores);

// acc[h * dim : (h + 1) * dim] = sum_j probs[h * len + j] * v_j for the same query heads.
template <typename T>
void attention_values_avx512(const SeqRows<T>& values, const float* probs, int64_t len, int64_t dim, int64_t group,
                             int64_t g0, int64_t g1, float* acc);

// One long sequence split across threads (paged_attention.cc): scores[h * len + j] for every query head and the
// keys j in [j0, j1) (j0 a multiple of 8; only the last range has j1 == len off a multiple of 8), each as
// attention_scores_avx512 computes it; and the values' columns [c0, c1) of a token row (kv_heads * dim wide,
// multiples of 16) for the query heads of the KV heads they belong to, each column summed as
// attention_values_avx512 sums it (acc[h * dim + c - g * dim]).
template <typename T>
void attention_key_range_avx512(const SeqRows<T>& keys, const float* qf, int64_t len, int64_t dim, int64_t group,
                                int64_t kv_heads, int64_t j0, int64_t j1, float* scores);
template <typename T>
void attention_value_columns_avx512(const SeqRows<T>& values, const float* probs, int64_t len, int64_t dim,
                                    int64_t group, int64_t c0, int64_t c1, float* acc);

// scores[i * lds + j] = q_i . k_j for nq query vectors (q: [nq, dim] float32, scaled) of KV head g over keys
// j < len: each score as attention_scores_avx512 computes it (the prefill kernel's scores).
template <typename T>
void query_scores_avx512(const SeqRows<T>& keys, int64_t g, const float* q, int64_t nq, int64_t dim, int64_t len,
                         float* scores, int64_t lds);

// s[0, len) = softmax(s[0, len)) in float32 (16 lanes, exp16, the sum in reduce1's tree), s[len, end) = 0: the
// softmax of both attention kernels on AVX-512.
void softmax_row_avx512(float* s, int64_t len, int64_t end);

}  // namespace rtp_llm
