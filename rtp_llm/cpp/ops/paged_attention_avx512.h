// The AVX-512 halves of the paged decode-attention kernel (paged_attention_avx512.cc), used by
// paged_decode_attention.cc for one sequence's task when the CPU has AVX-512 and head_dim % 16 == 0.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "rtp_llm/cpp/ops/paged_rows.h"

namespace rtp_llm {

// scores[h * len + j] = q_h . k_j for the query heads of KV heads [g0, g1) (group query heads each), every
// key j < len read in place; qf: float32 queries, already scaled.
template <typename T>
void attention_scores_avx512(const SeqRows<T>& keys, const float* qf, int64_t len, int64_t dim, int64_t group,
                             int64_t g0, int64_t g1, float* scores);

// acc[h * dim : (h + 1) * dim] = sum_j probs[h * len + j] * v_j for the same query heads.
template <typename T>
void attention_values_avx512(const SeqRows<T>& values, const float* probs, int64_t len, int64_t dim, int64_t group,
                             int64_t g0, int64_t g1, float* acc);

}  // namespace rtp_llm
