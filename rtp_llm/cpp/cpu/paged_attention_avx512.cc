// The two halves of paged attention with AVX-512 (chosen at run time by paged_attention.cc): q.k scores and
// the probability-weighted sum of values, for one sequence.
//
// Why: the AVX2 code reads the KV short of what memory streams: between the loads it spends its time on
// instructions. Here the scores take up to three query heads of a KV head at once, so each key vector is
// loaded once per group instead of once per head, and both halves run 16 lanes wide: about half the
// instructions per key (benchmarks.cpu_decode_attention).
//
// Summation order: a score is one 16-lane accumulator over head_dim, its lanes summed in reduce1's tree
// (reduce16v / reduce8v: the same tree for 16 or 8 at once, vec/avx512_sums.h); a softmax row: max, exp, the sum in 16 lanes then reduce1; a value
// column sums tokens in order. The prefill kernel (prefill_attention.cc) scores and normalises with the same
// functions, so a row's attention is bit for bit the same whichever kernel ran it (batch invariance: a prompt
// chunked, after a cached prefix or recomputed after preemption gives the tokens it gives whole).
#include "rtp_llm/cpp/cpu/paged_rows.h"

// The instantiations both branches below provide (the AVX-512 code, or stubs where it cannot be compiled).
#define RTP_INSTANTIATE(T)                                                                                      \
    template void attention_scores_avx512<T>(const SeqRows<T>&, const SeqRows<T>&, int64_t, const float*, int64_t, \
                                             int64_t, int64_t, int64_t, int64_t, float*);                       \
    template void attention_values_avx512<T>(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t, int64_t, \
                                             int64_t, float*);                                                  \
    template void query_scores_avx512<T>(const SeqRows<T>&, int64_t, const float*, int64_t, int64_t, int64_t,     \
                                         float*, int64_t);                                                      \
    template void attention_key_range_avx512<T>(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t,       \
                                                int64_t, int64_t, int64_t, float*);                             \
    template void attention_value_columns_avx512<T>(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t,   \
                                                    int64_t, int64_t, float*);

#if defined(__x86_64__) && defined(__GNUC__)
#include "rtp_llm/cpp/cpu/vec/avx512.h"

#include <algorithm>
#include <limits>

namespace rtp_llm {
namespace {

using avx512::load16;

// Query heads taken together: NH x 8 keys = 24 accumulators, plus NH query vectors and a key vector.
constexpr int kHeadsPerPass = 3;

// out[h * len + t] = q_h . (rows[t] + off) for NT keys (8, or 1 for the tail) and NH query heads; D: head_dim
// when it is a compile-time constant (64, 128: the loops unroll and the accumulators stay in registers through
// the reduction), 0 for any multiple of 16.
template <int NT, int NH, int D, typename T>
RTP_AVX512 inline void score_tile(const T* const* rows, int64_t off, const float* q, int64_t dim, float* out,
                                  int64_t len) {
    const int64_t n = D > 0 ? D : dim;
    __m512 acc[NH * NT];
    // Unrolled so that GCC keeps acc in registers: as a loop it becomes a memset of a stack copy (rep stos),
    // a fifth of this function's time.
#pragma GCC unroll 24
    for (int a = 0; a < NH * NT; ++a) acc[a] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int64_t d = 0; d < n; d += 16) {
        __m512 qv[NH];
        for (int h = 0; h < NH; ++h) qv[h] = _mm512_loadu_ps(q + h * n + d);
        for (int t = 0; t < NT; ++t) {
            __m512 kv = load16(rows[t] + off + d);
            asm("" : "+v"(kv));  // one load, kept for the NH FMAs (see gemv_avx512.cc)
            for (int h = 0; h < NH; ++h) acc[h * NT + t] = _mm512_fmadd_ps(kv, qv[h], acc[h * NT + t]);
        }
    }
    if constexpr (NT == 8) {
        int h = 0;
        for (; h + 2 <= NH; h += 2) {  // two heads' 8 keys in one 16-wide reduction
            const __m512 r = avx512::reduce16v(acc + h * 8);
            _mm256_storeu_ps(out + h * len, _mm512_castps512_ps256(r));
            _mm256_storeu_ps(out + (h + 1) * len, _mm512_extractf32x8_ps(r, 1));
        }
        if (h < NH) _mm256_storeu_ps(out + h * len, avx512::reduce8v(acc + h * 8));
    } else {
        for (int h = 0; h < NH; ++h)
            for (int t = 0; t < NT; ++t) out[h * len + t] = avx512::reduce1(acc[h * NT + t]);
    }
}

template <int NT, int D, typename T>
RTP_AVX512 inline void score_heads(const T* const* rows, int64_t off, const float* q, int64_t dim, int64_t heads,
                                   float* out, int64_t len) {
    for (int64_t h = 0; h < heads; h += kHeadsPerPass) {
        switch (std::min<int64_t>(kHeadsPerPass, heads - h)) {
            case 3: score_tile<NT, 3, D>(rows, off, q + h * dim, dim, out + h * len, len); break;
            case 2: score_tile<NT, 2, D>(rows, off, q + h * dim, dim, out + h * len, len); break;
            default: score_tile<NT, 1, D>(rows, off, q + h * dim, dim, out + h * len, len); break;
        }
    }
}

// scores[(g - g0) * heads * lds + h * lds + j] = q[(g - g0) * heads + h] . k_j[g] for the KV heads [g0, g1), each
// with `heads` query vectors (q scaled, [.., dim]), over the keys j < len: 8 keys per pass, the KV heads inside
// so that each token row is read once while in L1, then the tail one key at a time. `ahead`: prefetch the rows
// kAheadTokens ahead (decode, rows from memory; the prefill kernel's keys are already in L2), and with them the
// rows of values(t) for t < with_values.
// Keys [j0, len) only with j0 > 0 (a multiple of 8, so the 8-key groups are the whole sequence's).
template <int D, typename T>
RTP_AVX512 void scores_of_heads(const SeqRows<T>& keys, int64_t g0, int64_t g1, const float* q, int64_t heads,
                                int64_t dim, int64_t len, float* scores, int64_t lds, bool ahead,
                                const SeqRows<T>* values = nullptr, int64_t with_values = 0, int64_t j0 = 0) {
    const int64_t row_bytes = keys.token_stride * sizeof(T);
    const T* rows[8];
    int64_t j = j0;
    for (; j + 8 <= len; j += 8) {
        if (ahead) {
            for (int64_t t = j + kAheadTokens; t < std::min(len, j + kAheadTokens + 8); ++t) {
                prefetch_row(keys(t), row_bytes);
                if (t < with_values) prefetch_row((*values)(t), row_bytes);
            }
        }
        for (int t = 0; t < 8; ++t) rows[t] = keys(j + t);
        for (int64_t g = g0; g < g1; ++g)
            score_heads<8, D>(rows, g * dim, q + (g - g0) * heads * dim, dim, heads,
                              scores + (g - g0) * heads * lds + j, lds);
    }
    for (; j < len; ++j) {
        rows[0] = keys(j);
        for (int64_t g = g0; g < g1; ++g)
            score_heads<1, D>(rows, g * dim, q + (g - g0) * heads * dim, dim, heads,
                              scores + (g - g0) * heads * lds + j, lds);
    }
}

// acc[i][col : col + 16 COLS] += sum over the n tokens of p[i, t] * (rows[t] + off)[...] for NH query heads, the
// accumulators in registers across the tile.
template <int NH, int COLS, typename T>
RTP_AVX512 inline void value_tile(const T* const* rows, int64_t off, int64_t n, int64_t col, const float* probs,
                                  int64_t len, float* acc, int64_t dim) {
    __m512 a[NH][COLS];
    for (int i = 0; i < NH; ++i)
        for (int c = 0; c < COLS; ++c) a[i][c] = _mm512_loadu_ps(acc + i * dim + col + 16 * c);
    for (int64_t t = 0; t < n; ++t) {
        __m512 p[NH];
        for (int i = 0; i < NH; ++i) p[i] = _mm512_set1_ps(probs[i * len + t]);
        const T* row = rows[t] + off + col;
        for (int c = 0; c < COLS; ++c) {
            const __m512 v = load16(row + 16 * c);
            for (int i = 0; i < NH; ++i) a[i][c] = _mm512_fmadd_ps(p[i], v, a[i][c]);
        }
    }
    for (int i = 0; i < NH; ++i)
        for (int c = 0; c < COLS; ++c) _mm512_storeu_ps(acc + i * dim + col + 16 * c, a[i][c]);
}

// Up to 3 query heads over all columns, in strips of 16 * COLS (NH x COLS <= 24 accumulators); D as in score_tile.
template <int NH, int D, typename T>
RTP_AVX512 inline void value_heads(const T* const* rows, int64_t off, int64_t n, const float* probs, int64_t len,
                                   float* acc, int64_t dim) {
    if constexpr (D == 64 || D == 128) {
        value_tile<NH, D / 16>(rows, off, n, 0, probs, len, acc, dim);
    } else {
        constexpr int kCols = 8;
        int64_t c = 0;
        for (; c + 16 * kCols <= dim; c += 16 * kCols) value_tile<NH, kCols>(rows, off, n, c, probs, len, acc, dim);
        for (; c + 64 <= dim; c += 64) value_tile<NH, 4>(rows, off, n, c, probs, len, acc, dim);
        for (; c < dim; c += 16) value_tile<NH, 1>(rows, off, n, c, probs, len, acc, dim);
    }
}

template <int D, typename T>
RTP_AVX512 void values_of_heads(const SeqRows<T>& values, const float* probs, int64_t len, int64_t dim, int64_t group,
                                int64_t g0, int64_t g1, float* acc) {
    std::fill(acc + g0 * group * dim, acc + g1 * group * dim, 0.f);
    for_each_value_tile(values, len, g0, g1, [&](const T* const* rows, int64_t n, int64_t t0, int64_t g) {
        for (int64_t h = g * group; h < (g + 1) * group; h += kHeadsPerPass) {
            const float* p = probs + h * len + t0;
            float* a = acc + h * dim;
            switch (std::min<int64_t>(kHeadsPerPass, (g + 1) * group - h)) {
                case 3: value_heads<3, D>(rows, g * dim, n, p, len, a, dim); break;
                case 2: value_heads<2, D>(rows, g * dim, n, p, len, a, dim); break;
                default: value_heads<1, D>(rows, g * dim, n, p, len, a, dim); break;
            }
        }
    });
}

// Columns [c0, c1) (multiples of 16) of the token rows' values, every KV head's part of them, for its query heads:
// each output column sums its tokens in order, as values_of_heads does, so a split by columns changes no bit. The
// walk is for_each_value_tile's, its prefetches only the range's bytes of each row.
template <typename T>
RTP_AVX512 void values_of_columns(const SeqRows<T>& values, const float* probs, int64_t len, int64_t dim,
                                  int64_t group, int64_t c0, int64_t c1, float* acc) {
    const int64_t g0 = c0 / dim, g1 = (c1 + dim - 1) / dim, bytes = (c1 - c0) * sizeof(T);
    auto cols_of = [&](int64_t g) {
        return std::pair<int64_t, int64_t>{std::max(c0, g * dim) - g * dim, std::min(c1, (g + 1) * dim) - g * dim};
    };
    for (int64_t g = g0; g < g1; ++g) {
        const auto [lo, hi] = cols_of(g);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) std::fill(acc + h * dim + lo, acc + h * dim + hi, 0.f);
    }
    const T* rows[kValueTile];
    for (int64_t t0 = 0; t0 < len; t0 += kValueTile) {
        const int64_t n = std::min(kValueTile, len - t0);
        for (int64_t t = t0 + kValueTile; t < len && t < t0 + 2 * kValueTile; ++t) prefetch_row(values(t) + c0, bytes);
        for (int64_t t = 0; t < n; ++t) rows[t] = values(t0 + t);
        for (int64_t g = g0; g < g1; ++g) {
            const auto [lo, hi] = cols_of(g);
            for (int64_t h = g * group; h < (g + 1) * group; h += kHeadsPerPass) {
                const int64_t nh = std::min<int64_t>(kHeadsPerPass, (g + 1) * group - h);
                const float* p = probs + h * len + t0;
                float* a = acc + h * dim;
                for (int64_t c = lo; c < hi;) {
                    const int64_t strips = std::min<int64_t>(4, (hi - c) / 16);
                    auto run = [&](auto nh_c, auto cols_c) {
                        value_tile<decltype(nh_c)::value, decltype(cols_c)::value>(rows, g * dim, n, c, p, len, a,
                                                                                    dim);
                    };
                    auto by_cols = [&](auto nh_c) {
                        switch (strips) {
                            case 4: run(nh_c, std::integral_constant<int, 4>()); break;
                            case 3: run(nh_c, std::integral_constant<int, 3>()); break;
                            case 2: run(nh_c, std::integral_constant<int, 2>()); break;
                            default: run(nh_c, std::integral_constant<int, 1>()); break;
                        }
                    };
                    switch (nh) {
                        case 3: by_cols(std::integral_constant<int, 3>()); break;
                        case 2: by_cols(std::integral_constant<int, 2>()); break;
                        default: by_cols(std::integral_constant<int, 1>()); break;
                    }
                    c += 16 * strips;
                }
            }
        }
    }
}

}  // namespace

template <typename T>
RTP_AVX512 void attention_key_range_avx512(const SeqRows<T>& keys, const float* qf, int64_t len, int64_t dim,
                                           int64_t group, int64_t kv_heads, int64_t j0, int64_t j1, float* scores) {
    const SeqRows<T>* no_values = nullptr;  // the values pass reads its own columns (values_of_columns)
    switch (dim) {
        case 64: scores_of_heads<64>(keys, 0, kv_heads, qf, group, dim, j1, scores, len, true, no_values, 0, j0); break;
        case 128:
            scores_of_heads<128>(keys, 0, kv_heads, qf, group, dim, j1, scores, len, true, no_values, 0, j0);
            break;
        default: scores_of_heads<0>(keys, 0, kv_heads, qf, group, dim, j1, scores, len, true, no_values, 0, j0); break;
    }
}

template <typename T>
RTP_AVX512 void attention_value_columns_avx512(const SeqRows<T>& values, const float* probs, int64_t len,
                                               int64_t dim, int64_t group, int64_t c0, int64_t c1, float* acc) {
    values_of_columns(values, probs, len, dim, group, c0, c1, acc);
}

template <typename T>
RTP_AVX512 void attention_scores_avx512(const SeqRows<T>& keys, const SeqRows<T>& values, int64_t with_values,
                                        const float* qf, int64_t len, int64_t dim, int64_t group, int64_t g0,
                                        int64_t g1, float* scores) {
    const float* q = qf + g0 * group * dim;
    float* out = scores + g0 * group * len;
    switch (dim) {
        case 64: scores_of_heads<64>(keys, g0, g1, q, group, dim, len, out, len, true, &values, with_values); break;
        case 128: scores_of_heads<128>(keys, g0, g1, q, group, dim, len, out, len, true, &values, with_values); break;
        default: scores_of_heads<0>(keys, g0, g1, q, group, dim, len, out, len, true, &values, with_values); break;
    }
}

template <typename T>
RTP_AVX512 void query_scores_avx512(const SeqRows<T>& keys, int64_t g, const float* q, int64_t nq, int64_t dim,
                                    int64_t len, float* scores, int64_t lds) {
    switch (dim) {
        case 64: scores_of_heads<64>(keys, g, g + 1, q, nq, dim, len, scores, lds, false); break;
        case 128: scores_of_heads<128>(keys, g, g + 1, q, nq, dim, len, scores, lds, false); break;
        default: scores_of_heads<0>(keys, g, g + 1, q, nq, dim, len, scores, lds, false); break;
    }
}

RTP_AVX512 void softmax_row_avx512(float* s, int64_t len, int64_t end) {
    const auto mask_of = [](int64_t left) {
        return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
    };
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    // masked loads throughout: a row's tail may end its allocation, and a full load there can cross into an
    // unmapped page (a rare SIGSEGV under load, found by AddressSanitizer)
    for (int64_t t = 0; t < len; t += 16) {
        const __mmask16 k = mask_of(len - t);
        mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, s + t));
    }
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
    switch (dim) {
        case 64: values_of_heads<64>(values, probs, len, dim, group, g0, g1, acc); break;
        case 128: values_of_heads<128>(values, probs, len, dim, group, g0, g1, acc); break;
        default: values_of_heads<0>(values, probs, len, dim, group, g0, g1, acc); break;
    }
}

RTP_INSTANTIATE(float)
RTP_INSTANTIATE(c10::BFloat16)
#undef RTP_INSTANTIATE

}  // namespace rtp_llm

#else  // not x86-64 with GCC/Clang: never called (paged_attention.cc checks the CPU first)

namespace rtp_llm {
void softmax_row_avx512(float*, int64_t, int64_t) {}
template <typename T>
void query_scores_avx512(const SeqRows<T>&, int64_t, const float*, int64_t, int64_t, int64_t, float*, int64_t) {}
template <typename T>
void attention_scores_avx512(const SeqRows<T>&, const SeqRows<T>&, int64_t, const float*, int64_t, int64_t, int64_t,
                             int64_t, int64_t, float*) {}
template <typename T>
void attention_values_avx512(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*) {}
template <typename T>
void attention_key_range_avx512(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                float*) {}
template <typename T>
void attention_value_columns_avx512(const SeqRows<T>&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                    float*) {}
RTP_INSTANTIATE(float)
RTP_INSTANTIATE(c10::BFloat16)
#undef RTP_INSTANTIATE
}  // namespace rtp_llm

#endif
