// The GEMV kernel of gemv.cc for CPUs with AVX-512 (checked at run time; the file is compiled for
// any x86-64 with the instructions enabled per function, so nothing here runs on a CPU without them).
//
// Why a second kernel: with AVX2's 16 registers, 5-8 input rows cannot all meet a weight vector in one
// pass, so the AVX2 kernel takes them in pairs and re-reads each weight block from L1, and the memory bus
// idles while the later pairs compute (at 8 rows slower than oneDNN's packed GEMM). With 32 registers all rows (up to 8; 9-16 in two passes) x a few weight rows are accumulated
// in one pass, so every weight byte is loaded once and the stream never pauses.
//
// Summation order, per output: one 16-lane accumulator over k (in steps of 16, the tail masked), its lanes
// summed in one fixed tree (reduce1 / reduce8); the same for every row count and grouping, so a sequence's
// result does not depend on how many others share its step.
#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__) && defined(__GNUC__)

#include "rtp_llm/cpp/cpu/vec/avx512.h"

namespace rtp_llm {
namespace {

using avx512::load16;
using avx512::reduce1;
using avx512::reduce8;

// Rows ahead of the one being read whose lines are prefetched into L2 (see gemv.cc).
constexpr int64_t kPrefetchRows = 16;

// out[r * G + q] = <w + q * k, x + r * k> for M input rows and G consecutive weight rows.
template <typename T, int M, int G>
RTP_AVX512 inline void dot_block(const T* w, const float* x, int64_t k, float* out) {
    constexpr int64_t line = 64 / sizeof(T);
    constexpr int kAcc = M * G;
    const int64_t ahead = kPrefetchRows * k;
    __m512 acc[(kAcc + 7) / 8 * 8];  // padded with zeros to whole groups of 8 for reduce8
#pragma GCC unroll 32  // kept in registers, not a memset of a stack copy (see paged_attention_avx512.cc)
    for (int a = 0; a < (kAcc + 7) / 8 * 8; ++a) acc[a] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        if (i % line == 0) {
            for (int q = 0; q < G; ++q) __builtin_prefetch(w + q * k + ahead + i, 0, 2);
        }
        __m512 wv[G];
        for (int q = 0; q < G; ++q) wv[q] = load16(w + q * k + i);
        for (int r = 0; r < M; ++r) {
            __m512 xv = _mm512_loadu_ps(x + r * k + i);
            // Kept in a register: otherwise GCC folds the load into each of the G FMAs, and G loads per input
            // vector make the loop load-bound (Zen 4 loads one 512-bit vector per cycle).
            asm("" : "+v"(xv));
            for (int q = 0; q < G; ++q) acc[r * G + q] = _mm512_fmadd_ps(wv[q], xv, acc[r * G + q]);
        }
    }
    if (i < k) {  // the tail: masked loads into the same accumulators (zeros in the other lanes)
        const __mmask16 mask = static_cast<__mmask16>((1u << (k - i)) - 1);
        __m512 wv[G];
        for (int q = 0; q < G; ++q) wv[q] = load16(w + q * k + i, mask);
        for (int r = 0; r < M; ++r) {
            const __m512 xv = load16(x + r * k + i, mask);
            for (int q = 0; q < G; ++q) acc[r * G + q] = _mm512_fmadd_ps(wv[q], xv, acc[r * G + q]);
        }
    }
    if constexpr (kAcc == 1) {
        out[0] = reduce1(acc[0]);
    } else {
        float sums[(kAcc + 7) / 8 * 8];
        for (int a = 0; a < kAcc; a += 8) reduce8(acc + a, sums + a);
        for (int a = 0; a < kAcc; ++a) out[a] = sums[a];
    }
}

// Weight rows per pass for M input rows: M x G accumulators plus G weight vectors and one input vector fit
// the 32 registers, with as few loads per FMA as that allows; at least 8 chains cover the FMA latency.
template <int M>
constexpr int group() {
    return M == 1 ? 8 : M <= 3 ? 6 : M <= 6 ? 4 : 3;
}
constexpr int64_t kBlock = 24;  // weight rows per unit of the thread split (a multiple of every group())

// Rows [j0, j1) of the output for M input rows. Up to 8 rows in one pass; 9-16 in two passes over each
// group of G weight rows (8 rows, then the rest), the second reading the G rows from L1: the weights still
// stream from memory once; past ~10 rows the step turns compute-bound (benchmarks.cpu_linear --stream).
template <typename T, int M>
RTP_AVX512 void rows_block(const T* w, const float* x, const float* bias, T* out, int64_t k, int64_t n,
                           int64_t j0, int64_t j1) {
    constexpr int M1 = M <= 8 ? M : 8, M2 = M - M1;
    constexpr int G = group<M1>();
    float res[M1 * G];
    auto store = [&](int r0, int rows, int g, int64_t j) {
        for (int r = 0; r < rows; ++r)
            for (int q = 0; q < g; ++q) {
                const float v = res[r * g + q];
                out[(r0 + r) * n + j + q] = static_cast<T>(bias ? v + bias[j + q] : v);
            }
    };
    int64_t j = j0;
    for (; j + G <= j1; j += G) {
        dot_block<T, M1, G>(w + j * k, x, k, res);
        store(0, M1, G, j);
        if constexpr (M2 > 0) {
            dot_block<T, M2, G>(w + j * k, x + M1 * k, k, res);
            store(M1, M2, G, j);
        }
    }
    for (; j < j1; ++j) {  // n not a multiple of G: one weight row at a time, same order per output
        dot_block<T, M1, 1>(w + j * k, x, k, res);
        store(0, M1, 1, j);
        if constexpr (M2 > 0) {
            dot_block<T, M2, 1>(w + j * k, x + M1 * k, k, res);
            store(M1, M2, 1, j);
        }
    }
}

template <typename T, int M>
void gemv_m(const T* w, const float* x, const float* bias, T* out, int64_t k, int64_t n) {
    // Grain 3 blocks: a task streams >= 72 weight rows, enough to amortise the scheduling.
    parallel_for(0, (n + kBlock - 1) / kBlock, 3, [&](int64_t begin, int64_t end) {
        rows_block<T, M>(w, x, bias, out, k, n, begin * kBlock, std::min(n, end * kBlock));
    });
}

template <typename T>
void gemv_any(const T* w, const float* x, const float* bias, T* out, int64_t m, int64_t k, int64_t n) {
    switch (m) {
#define RTP_GEMV_CASE(M) \
    case M: return gemv_m<T, M>(w, x, bias, out, k, n);
        RTP_GEMV_CASE(1) RTP_GEMV_CASE(2) RTP_GEMV_CASE(3) RTP_GEMV_CASE(4)
        RTP_GEMV_CASE(5) RTP_GEMV_CASE(6) RTP_GEMV_CASE(7) RTP_GEMV_CASE(8)
        RTP_GEMV_CASE(9) RTP_GEMV_CASE(10) RTP_GEMV_CASE(11) RTP_GEMV_CASE(12)
        RTP_GEMV_CASE(13) RTP_GEMV_CASE(14) RTP_GEMV_CASE(15) RTP_GEMV_CASE(16)
#undef RTP_GEMV_CASE
        default: TORCH_CHECK(false, "gemv_avx512: 1-", kGemvMaxRows, " rows, got ", m);
    }
}

}  // namespace

void gemv_avx512(const float* w, const float* x, const float* bias, float* out, int64_t m, int64_t k, int64_t n) {
    gemv_any<float>(w, x, bias, out, m, k, n);
}

void gemv_avx512(const c10::BFloat16* w, const float* x, const float* bias, c10::BFloat16* out, int64_t m,
                 int64_t k, int64_t n) {
    gemv_any<c10::BFloat16>(w, x, bias, out, m, k, n);
}

}  // namespace rtp_llm

#else  // not x86-64 with GCC/Clang: the AVX2 / portable kernel serves every CPU

namespace rtp_llm {
void gemv_avx512(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) {}
void gemv_avx512(const c10::BFloat16*, const float*, const float*, c10::BFloat16*, int64_t, int64_t, int64_t) {}
}  // namespace rtp_llm

#endif
