// The kernel's per-row algorithm written as host C++ that walks the row exactly as the AscendC kernel
// does (chunks from the tiling, two passes, a carried cumulative sum), for the gtest: it must agree with
// the plain documented algorithm for every tiling. Float32 math, like the kernel's.
#ifndef APPLY_TOP_K_TOP_P_CUSTOM_REFERENCE_H
#define APPLY_TOP_K_TOP_P_CUSTOM_REFERENCE_H

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "apply_top_k_top_p_custom_tiling_plan.h"

namespace apply_top_k_top_p {

// sorted: one row ascending; indices: original positions; k/p as the op receives them.
// Writes out[indices[i]] = sorted[i] for survivors and -inf elsewhere.
inline void KernelRow(const TilingParams& t, const float* sorted, const int32_t* indices, int32_t k, float p,
                      float* out) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const uint32_t v = t.vocab;
    for (uint32_t i = 0; i < v; ++i) out[i] = neg_inf;  // the output row starts as -inf
    if (t.tilingKey == kCopy) {
        for (uint32_t i = 0; i < v; ++i) out[indices[i]] = sorted[i];
        return;
    }
    const bool useK = t.tilingKey != kTopPOnly, useP = t.tilingKey != kTopKOnly;
    uint32_t kk = useK ? static_cast<uint32_t>(k < 1 ? 1 : k) : v;
    if (kk > v) kk = v;
    const float threshold = sorted[v - kk];
    const float mx = sorted[v - 1];  // the largest survives always
    // pass 1: sum of exp over survivors, chunk by chunk
    float total = 0.f;
    for (uint32_t c = 0; c < t.iterateTimes; ++c) {
        const uint32_t base = c * t.chunkElements;
        const uint32_t n = c + 1 == t.iterateTimes ? t.tailChunkElements : t.chunkElements;
        float chunk = 0.f;
        for (uint32_t i = 0; i < n; ++i) {
            const float x = sorted[base + i];
            if (x >= threshold) chunk += std::exp(x - mx);
        }
        total += chunk;
    }
    // pass 2: normalised cumulative sum with the carry from earlier chunks; select and scatter
    float carry = 0.f;
    for (uint32_t c = 0; c < t.iterateTimes; ++c) {
        const uint32_t base = c * t.chunkElements;
        const uint32_t n = c + 1 == t.iterateTimes ? t.tailChunkElements : t.chunkElements;
        for (uint32_t i = 0; i < n; ++i) {
            const uint32_t pos = base + i;
            const float x = sorted[pos];
            if (x < threshold) continue;
            carry += std::exp(x - mx) / total;
            const bool keep = !useP || pos == v - 1 || carry > 1.f - p;
            if (keep) out[indices[pos]] = x;
        }
    }
}

}  // namespace apply_top_k_top_p

#endif  // APPLY_TOP_K_TOP_P_CUSTOM_REFERENCE_H
