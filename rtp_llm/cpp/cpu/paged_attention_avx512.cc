// The two halves of paged attention with AVX-512 (chosen at run time by paged_attention.cc): q.k scores and
// the probability-weighted sum of values, for one sequence.
//
// Why: the AVX2 code reads the KV short of what memory streams: between the loads it spends its time on
// instructions. Here the scores take up to three query heads of a KV head at once, so each key vector is
// loaded once per group instead of once per head, and both halves run 16 lanes wide: about half the
// instructions per key (benchmarks.cpu_decode_attention).
//
// Summation order: a score is one 16-lane accumulator over head_dim, its lanes summed in reduce1's tree
// (reduce8 is the same tree for 8 at once); a softmax row: max, exp, the sum in 16 lanes then reduce1; a value
// column sums tokens in order. The prefill kernel (prefill_attention.cc) scores and normalises with the same
// functions, so a row's attention is bit for bit the same whichever kernel ran it (batch invariance: a prompt
// chunked, after a cached prefix or recomputed after preemption gives the tokens it gives whole).
#include "rtp_llm/cpp/cpu/paged_rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "rtp_llm/cpp/cpu/vec/avx512.h"

#include <algorithm>
#include <limits>

namespace rtp_llm {
namespace {

using avx512::load16;

// Query heads taken together: NH x 8 keys = 24 accumulators, plus NH query vectors and a key vector.
constexpr int kHeadsPerPass = 3;

// out[h * len + t] = q_h . rows[t] for NT keys (8, or 1 for the tail) and NH query heads.
template <int NT, int NH, typename T>
RTP_AVX512 inline void score_tile(const T* const* rows, const float* q, int64_t dim, float* out, int64_t len) {
    __m512 acc[NH * NT];
    // Unrolled so that GCC keeps acc in registers: as a loop it becomes a memset of a stack copy (rep stos),
    // a fifth of this function's time.
#pragma GCC unroll 24
    for (int a = 0; a < NH * NT; ++a) acc[a] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d += 16) {
        __m512 qv[NH];
        for (int h = 0; h < NH; ++h) qv[h] = _mm512_loadu_ps(q + h * dim + d);
        for (int t = 0; t < NT; ++t) {
            __m512 kv = load16(rows[t] + d);
            asm("" : "+v"(kv));  // one load, kept for the NH FMAs (see gemv_avx512.cc)
            for (int h = 0; h < NH; ++h) acc[h * NT + t] = _mm512_fmadd_ps(kv, qv[h], acc[h * NT + t]);
        }
    }
    for (int h = 0; h < NH; ++h) {
        if constexpr (NT == 8) {
            avx512::reduce8(acc + h * 8, out + h * len);
        } else {
            for (int t = 0; t < NT; ++t) out[h * len + t] = avx512::reduce1(acc[h * NT + t]);
        }
    }
}

template <int NT, typename T>
RTP_AVX512 inline void score_heads(const T* const* rows, const float* q, int64_t dim, int64_t heads, float* out,
                                   int64_t len) {
    for (int64_t h = 0; h < heads; h += kHeadsPerPass) {
        switch (std::min<int64_t>(kHeadsPerPass, heads - h)) {
            case 3: score_tile<NT, 3>(rows, q + h * dim, dim, out + h * len, len); break;
            case 2: score_tile<NT, 2>(rows, q + h * dim, dim, out + h * len, len); break;
            default: score_tile<NT, 1>(rows, q + h * dim, dim, out + h * len, len); break;
        }
    }
}

// acc[i][col : col + 16 COLS] += sum over the n tokens of p[i, t] * v_t for NH query heads, the accumulators
// in registers across the tile.
template <int NH, int COLS, typename T>
RTP_AVX512 inline void value_tile(const T* const* rows, int64_t n, int64_t col, const float* probs, int64_t len,
                                  float* acc, int64_t dim) {
    __m512 a[NH][COLS];
    for (int i = 0; i < NH; ++i)
        for (int c = 0; c < COLS; ++c) a[i][c] = _mm512_loadu_ps(acc + i * dim + col + 16 * c);
    for (int64_t t = 0; t < n; ++t) {
        __m512 p[NH];
        for (int i = 0; i < NH; ++i) p[i] = _mm512_set1_ps(probs[i * len + t]);
        for (int c = 0; c < COLS; ++c) {
            const __m512 v = load16(rows[t] + col + 16 * c);
            for (int i = 0; i < NH; ++i) a[i][c] = _mm512_fmadd_ps(p[i], v, a[i][c]);
        }
    }
    for (int i = 0; i < NH; ++i)
        for (int c = 0; c < COLS; ++c) _mm512_storeu_ps(acc + i * dim + col + 16 * c, a[i][c]);
}

// Up to 3 query heads over all columns, in strips of 16 * COLS (NH x COLS <= 24 accumulators).
template <int NH, typename T>
RTP_AVX512 inline void value_heads(const T* const* rows, int64_t n, const float* probs, int64_t len, float* acc,
                                   int64_t dim) {
    constexpr int kCols = 8;
    int64_t c = 0;
    for (; c + 16 * kCols <= dim; c += 16 * kCols) value_tile<NH, kCols>(rows, n, c, probs, len, acc, dim);
    for (; c + 64 <= dim; c += 64) value_tile<NH, 4>(rows, n, c, probs, len, acc, dim);
    for (; c < dim; c += 16) value_tile<NH, 1>(rows, n, c, probs, len, acc, dim);
}

}  // namespace

template <typename T>
RTP_AVX512 void attention_scores_avx512(const SeqRows<T>& keys, const float* qf, int64_t len, int64_t dim,
                                        int64_t group, int64_t g0, int64_t g1, float* scores) {
    const int64_t row_bytes = keys.token_stride * sizeof(T);
    const T* rows[8];
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
        for (int64_t t = j + kAheadTokens; t < std::min(len, j + kAheadTokens + 8); ++t) prefetch_row(keys(t), row_bytes);
        for (int64_t g = g0; g < g1; ++g) {
            for (int t = 0; t < 8; ++t) rows[t] = keys(j + t) + g * dim;
            score_heads<8>(rows, qf + g * group * dim, dim, group, scores + g * group * len + j, len);
        }
    }
    for (; j < len; ++j) {
        for (int64_t g = g0; g < g1; ++g) {
            rows[0] = keys(j) + g * dim;
            score_heads<1>(rows, qf + g * group * dim, dim, group, scores + g * group * len + j, len);
        }
    }
}

template <typename T>
RTP_AVX512 void query_scores_avx512(const SeqRows<T>& keys, int64_t g, const float* q, int64_t nq, int64_t dim,
                                    int64_t len, float* scores, int64_t lds) {
    const T* rows[8];
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
        for (int t = 0; t < 8; ++t) rows[t] = keys(j + t) + g * dim;
        score_heads<8>(rows, q, dim, nq, scores + j, lds);
    }
    for (; j < len; ++j) {
        rows[0] = keys(j) + g * dim;
        score_heads<1>(rows, q, dim, nq, scores + j, lds);
    }
}

RTP_AVX512 void softmax_row_avx512(float* s, int64_t len, int64_t end) {
    const auto mask_of = [](int64_t left) {
        return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
    };
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < len; t += 16)
        mx = _mm512_mask_max_ps(mx, mask_of(len - t), mx, _mm512_loadu_ps(s + t));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += 16) {
        const __mmask16 k = mask_of(len - t);
        const __m512 e = avx512::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), m));
        _mm512_mask_storeu_ps(s + t, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.f / avx512::reduce1(sum));
    for (int64_t t = 0; t < len; t += 16) {
        const __mmask16 k = mask_of(len - t);
        _mm512_mask_storeu_ps(s + t, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + t), inv));
    }
    std::fill(s + len, s + end, 0.f);
}

template <typename T>
RTP_AVX512 void attention_values_avx512(const SeqRows<T>& values, const float* probs, int64_t len, int64_t dim,
                                        int64_t group, int64_t g0, int64_t g1, float* acc) {
    std::fill(acc + g0 * group * dim, acc + g1 * group * dim, 0.f);
    for_each_value_tile(values, len, dim, g0, g1, [&](const T* const* rows, int64_t n, int64_t t0, int64_t g) {
        for (int64_t h = g * group; h < (g + 1) * group; h += kHeadsPerPass) {
            const float* p = probs + h * len + t0;
            float* a = acc + h * dim;
            switch (std::min<int64_t>(kHeadsPerPass, (g + 1) * group - h)) {
                case 3: value_heads<3>(rows, n, p, len, a, dim); break;
                case 2: value_heads<2>(rows, n, p, len, a, dim); break;
                default: value_heads<1>(rows, n, p, len, a, dim); break;
            }
        }
    });
}

#define RTP_INSTANTIATE(T)                                                                                      \
    template void attention_scores_avx512<T>(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t, int64_t, \
                                             int64_t, float*);                                                  \
    template void attention_values_avx512<T>(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t, int64_t, \
                                             int64_t, float*);                                                  \
    template void query_scores_avx512<T>(const SeqRows<T>&, int64_t, const float*, int64_t, int64_t, int64_t,     \
                                         float*, int64_t);
RTP_INSTANTIATE(float)
RTP_INSTANTIATE(c10::BFloat16)
#undef RTP_INSTANTIATE

}  // namespace rtp_llm

#else  // not x86-64 with GCC/Clang: never called (paged_attention.cc checks the CPU first)

namespace rtp_llm {
void softmax_row_avx512(float*, int64_t, int64_t) {}
template <typename T>
void query_scores_avx512(const SeqRows<T>&, int64_t, const float*, int64_t, int64_t, int64_t, float*, int64_t) {}
template void query_scores_avx512<float>(const SeqRows<float>&, int64_t, const float*, int64_t, int64_t, int64_t,
                                         float*, int64_t);
template void query_scores_avx512<c10::BFloat16>(const SeqRows<c10::BFloat16>&, int64_t, const float*, int64_t,
                                                 int64_t, int64_t, float*, int64_t);
template <typename T>
void attention_scores_avx512(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*) {}
template <typename T>
void attention_values_avx512(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*) {}
template void attention_scores_avx512<float>(const SeqRows<float>&, const float*, int64_t, int64_t, int64_t, int64_t,
                                             int64_t, float*);
template void attention_values_avx512<float>(const SeqRows<float>&, const float*, int64_t, int64_t, int64_t, int64_t,
                                             int64_t, float*);
template void attention_scores_avx512<c10::BFloat16>(const SeqRows<c10::BFloat16>&, const float*, int64_t, int64_t,
                                                     int64_t, int64_t, int64_t, float*);
template void attention_values_avx512<c10::BFloat16>(const SeqRows<c10::BFloat16>&, const float*, int64_t, int64_t,
                                                     int64_t, int64_t, int64_t, float*);
}  // namespace rtp_llm

#endif
