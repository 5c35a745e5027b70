// The greedy token of each row of logits: argmax with torch.argmax's ties (the lowest index), for heads whose
// logits are computed in full (bf16 runs, GGUF heads kept as stored).
//
// Why: torch's argmax reduces one element at a time, and a bf16 row first becomes a float32 copy. Here 8 lanes (16
// with AVX-512) keep their running maximum and its index, four such sets to hide the compare-and-blend latency.
#include <ATen/ATen.h>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/cpu_features.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include "rtp_llm/cpp/cpu/vec/avx512.h"
#endif
#include "rtp_llm/cpp/cpu/work_pool.h"

#include <cmath>

namespace rtp_llm {
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// row_argmax on AVX-512 (cpu_avx512()): 16 lanes, four sets of running maxima and their indices in registers,
// the compare in a mask register (half the AVX2 loop's instructions per logit). Same result: the first maximum,
// -1 for a row with a NaN.
template <typename T>
RTP_AVX512 int64_t row_argmax_avx512(const T* x, int64_t n) {
    constexpr int kSets = 4, kStep = 16 * kSets;
    __m512 mx[kSets];
    __m512i at[kSets];
    __mmask16 unordered = 0;
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int s = 0; s < kSets; ++s) {
        mx[s] = avx512::load16(x + 16 * s);
        at[s] = _mm512_add_epi32(lanes, _mm512_set1_epi32(16 * s));
        unordered |= _mm512_cmp_ps_mask(mx[s], mx[s], _CMP_UNORD_Q);
    }
    int64_t i = kStep;
    for (; i + kStep <= n; i += kStep) {
        for (int s = 0; s < kSets; ++s) {
            const __m512 v = avx512::load16(x + i + 16 * s);
            const __mmask16 gt = _mm512_cmp_ps_mask(v, mx[s], _CMP_GT_OQ);  // strictly greater: the first one stays
            unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            mx[s] = _mm512_mask_mov_ps(mx[s], gt, v);
            const __m512i idx = _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int>(i + 16 * s)));
            at[s] = _mm512_mask_mov_epi32(at[s], gt, idx);
        }
    }
    if (unordered) return -1;
    alignas(64) float m[kSets][16];
    alignas(64) int32_t a[kSets][16];
    for (int s = 0; s < kSets; ++s) {
        _mm512_store_ps(m[s], mx[s]);
        _mm512_store_si512(a[s], at[s]);
    }
    float best = m[0][0];
    int64_t best_i = a[0][0];
    for (int s = 0; s < kSets; ++s)
        for (int l = 0; l < 16; ++l)
            if (m[s][l] > best || (m[s][l] == best && a[s][l] < best_i)) best = m[s][l], best_i = a[s][l];
    for (; i < n; ++i) {
        const float v = static_cast<float>(x[i]);
        if (std::isnan(v)) return -1;
        if (v > best) best = v, best_i = i;
    }
    return best_i;
}
#endif

// The index of the row's first maximum; -1 if the row holds a NaN (torch.argmax then names the first NaN: the
// caller asks torch for those rows).
template <typename T>
int64_t row_argmax(const T* x, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    static const bool wide = cpu_avx512();
    if (wide && n >= 64) return row_argmax_avx512(x, n);
#endif
    int64_t i = 0;
    float best = -INFINITY;
    int64_t best_i = 0;
#ifdef __AVX2__
    if (n >= 32) {
        constexpr int kSets = 4;
        __m256 mx[kSets], unordered = _mm256_setzero_ps();
        __m256i at[kSets];
        const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (int s = 0; s < kSets; ++s) {
            mx[s] = vec::load8(x + 8 * s);
            at[s] = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * s));
            unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(mx[s], mx[s], _CMP_UNORD_Q));
        }
        __m256i idx = _mm256_add_epi32(lanes, _mm256_set1_epi32(32));
        const __m256i step = _mm256_set1_epi32(8);
        for (i = 32; i + 32 <= n; i += 32) {
            for (int s = 0; s < kSets; ++s) {
                const __m256 v = vec::load8(x + i + 8 * s);
                const __m256 gt = _mm256_cmp_ps(v, mx[s], _CMP_GT_OQ);  // strictly greater: the first one stays
                unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                mx[s] = _mm256_blendv_ps(mx[s], v, gt);
                at[s] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at[s]), _mm256_castsi256_ps(idx), gt));
                idx = _mm256_add_epi32(idx, step);
            }
        }
        if (_mm256_movemask_ps(unordered)) return -1;
        alignas(32) float m[kSets][8];
        alignas(32) int32_t a[kSets][8];
        for (int s = 0; s < kSets; ++s) {
            _mm256_store_ps(m[s], mx[s]);
            _mm256_store_si256(reinterpret_cast<__m256i*>(a[s]), at[s]);
        }
        best = m[0][0], best_i = a[0][0];
        for (int s = 0; s < kSets; ++s)
            for (int l = 0; l < 8; ++l)
                if (m[s][l] > best || (m[s][l] == best && a[s][l] < best_i)) best = m[s][l], best_i = a[s][l];
    }
#endif
    for (; i < n; ++i) {
        const float v = static_cast<float>(x[i]);
        if (std::isnan(v)) return -1;
        if (v > best || i == 0) best = v, best_i = i;
    }
    return best_i;
}

template <typename T>
void argmax_all(const at::Tensor& logits, at::Tensor& ids) {
    const int64_t rows = logits.size(0), n = logits.size(1);
    const T* x = logits.data_ptr<T>();
    int64_t* out = ids.data_ptr<int64_t>();
    parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) out[r] = row_argmax(x + r * n, n);
    });
}

}  // namespace

at::Tensor argmax_rows(const at::Tensor& logits) {
    TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.size(1) >= 1,
                "argmax_rows: logits must be a [rows, vocab >= 1] CPU tensor, got ", logits.sizes());
    TORCH_CHECK(logits.size(1) < (int64_t{1} << 31), "argmax_rows: a row of 2^31 logits or more");
    auto c = logits.contiguous();
    auto ids = at::empty({c.size(0)}, c.options().dtype(at::kLong));
    if (c.scalar_type() == at::kFloat) {
        argmax_all<float>(c, ids);
    } else if (c.scalar_type() == at::kBFloat16) {
        argmax_all<c10::BFloat16>(c, ids);
    } else {
        TORCH_CHECK(false, "argmax_rows: float32 or bfloat16 logits, got ", c.scalar_type());
    }
    return ids;
}

}  // namespace rtp_llm
