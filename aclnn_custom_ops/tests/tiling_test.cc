// The op_host tiling and the kernel-shaped row algorithm, on the host: every tiling covers the rows
// and the vocabulary exactly, fits the UB, and the chunked row algorithm agrees with the documented
// one (plain, double precision) for k = 1, V, > V and p = 0, 1 and in between.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "apply_top_k_top_p_custom/op_host/apply_top_k_top_p_custom_reference.h"
#include "apply_top_k_top_p_custom/op_host/apply_top_k_top_p_custom_tiling_plan.h"

namespace apply_top_k_top_p {
namespace {

const uint32_t kVocabs[] = {1, 2, 7, 31, 1023, 1025, 50257, 151936, 262144};
const uint64_t kUbs[] = {8 * 1024 + 40 * 16, 8 * 1024 + 24 * 100, 64 * 1024, 192 * 1024};

TEST(Tiling, CoversRowsAndVocabularyAndFitsTheUb) {
    for (uint32_t vocab : kVocabs) {
        for (uint64_t ub : kUbs) {
            for (uint32_t bytes : {2u, 4u}) {
                for (uint32_t batch : {1u, 3u, 48u, 100u}) {
                    for (uint32_t cores : {1u, 20u, 48u}) {
                        TilingParams t;
                        ASSERT_EQ(ComputeTiling(batch, vocab, bytes, cores, ub, true, true, &t), 0);
                        EXPECT_EQ(t.usedCores, std::min(batch, cores));
                        // rows: disjoint, contiguous, all of them
                        uint32_t next = 0;
                        for (uint32_t c = 0; c < t.usedCores; ++c) {
                            uint32_t first, count;
                            RowsOfCore(t, c, &first, &count);
                            EXPECT_EQ(first, next);
                            EXPECT_GE(count, 1u);
                            next = first + count;
                        }
                        EXPECT_EQ(next, batch);
                        // chunks: aligned to 32 bytes, at most 1024, covering the row exactly
                        EXPECT_EQ((t.chunkElements * bytes) % kBlockBytes, 0u);
                        EXPECT_LE(t.chunkElements, kMaxChunkElements);
                        EXPECT_GE(t.tailChunkElements, 1u);
                        EXPECT_LE(t.tailChunkElements, t.chunkElements);
                        EXPECT_EQ(uint64_t(t.chunkElements) * (t.iterateTimes - 1) + t.tailChunkElements, vocab);
                        EXPECT_LE(t.chunkElements * UbBytesPerElement(bytes) + kReservedUbBytes, ub);
                    }
                }
            }
        }
    }
}

TEST(Tiling, KeysAndErrors) {
    TilingParams t;
    ASSERT_EQ(ComputeTiling(4, 100, 4, 8, 192 * 1024, true, true, &t), 0);
    EXPECT_EQ(t.tilingKey, kTopKTopP);
    ASSERT_EQ(ComputeTiling(4, 100, 4, 8, 192 * 1024, true, false, &t), 0);
    EXPECT_EQ(t.tilingKey, kTopKOnly);
    ASSERT_EQ(ComputeTiling(4, 100, 4, 8, 192 * 1024, false, true, &t), 0);
    EXPECT_EQ(t.tilingKey, kTopPOnly);
    ASSERT_EQ(ComputeTiling(4, 100, 4, 8, 192 * 1024, false, false, &t), 0);
    EXPECT_EQ(t.tilingKey, kCopy);
    ASSERT_EQ(ComputeTiling(4, 1, 4, 8, 192 * 1024, true, true, &t), 0);
    EXPECT_EQ(t.tilingKey, kCopy);  // V == 1 copies the input
    EXPECT_EQ(ComputeTiling(0, 100, 4, 8, 192 * 1024, true, true, &t), 2);
    EXPECT_EQ(ComputeTiling(1, 0, 4, 8, 192 * 1024, true, true, &t), 2);
    EXPECT_EQ(ComputeTiling(1, 100, 8, 8, 192 * 1024, true, true, &t), 3);
    EXPECT_EQ(ComputeTiling(1, 100, 4, 0, 192 * 1024, true, true, &t), 4);
    EXPECT_EQ(ComputeTiling(1, 100, 4, 8, 8 * 1024, true, true, &t), 5);
    EXPECT_EQ(ComputeTiling(1, 100, 4, 8, 8 * 1024 + 10, true, true, &t), 5);
    EXPECT_STREQ(ErrorText(5), "UB too small for one 32-byte aligned chunk");
}

// The documented algorithm, plainly, in double precision. Returns the kept original positions and, per
// kept/dropped decision, how close the cumulative sum was to the 1 - p boundary.
std::vector<float> Documented(const std::vector<float>& logits, int32_t k, float p, bool useK, bool useP,
                              std::vector<double>* margin) {
    const size_t v = logits.size();
    std::vector<int32_t> idx(v);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
    const size_t kk = useK ? std::min<size_t>(std::max<int32_t>(k, 1), v) : v;
    const float thr = logits[idx[v - kk]];
    const double mx = logits[idx[v - 1]];
    double total = 0;
    for (size_t i = 0; i < v; ++i)
        if (logits[idx[i]] >= thr) total += std::exp(logits[idx[i]] - mx);
    std::vector<float> out(v, -std::numeric_limits<float>::infinity());
    double cum = 0;
    for (size_t i = 0; i < v; ++i) {
        const float x = logits[idx[i]];
        if (x < thr) continue;
        cum += std::exp(x - mx) / total;
        margin->push_back(std::fabs(cum - (1.0 - p)));
        if (!useP || i == v - 1 || cum > 1.0 - p) out[idx[i]] = x;
    }
    return out;
}

void CheckRow(uint32_t vocab, uint64_t ub, int32_t k, float p, bool useK, bool useP, std::mt19937* rng) {
    std::normal_distribution<float> dist(0.f, 3.f);
    std::vector<float> logits(vocab);
    for (auto& x : logits) x = std::round(dist(*rng) * 4.f) / 4.f;  // quarter steps: plenty of ties
    std::vector<int32_t> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
    std::vector<float> sorted(vocab);
    for (uint32_t i = 0; i < vocab; ++i) sorted[i] = logits[idx[i]];
    TilingParams t;
    ASSERT_EQ(ComputeTiling(1, vocab, 4, 1, ub, useK, useP, &t), 0);
    std::vector<float> got(vocab);
    KernelRow(t, sorted.data(), idx.data(), k, p, got.data());
    std::vector<double> margin;
    const std::vector<float> want = Documented(logits, k, p, useK, useP, &margin);
    size_t mismatches = 0;
    for (uint32_t i = 0; i < vocab; ++i) mismatches += (got[i] == want[i] || (std::isinf(got[i]) && std::isinf(want[i]))) ? 0 : 1;
    // float32 chunked sums may only disagree where the double cumulative sum sits on the boundary
    const size_t near = std::count_if(margin.begin(), margin.end(), [](double m) { return m < 1e-5; });
    EXPECT_LE(mismatches, near) << "vocab " << vocab << " ub " << ub << " k " << k << " p " << p;
}

TEST(KernelRow, AgreesWithTheDocumentedAlgorithm) {
    std::mt19937 rng(7);
    for (uint32_t vocab : {1u, 2u, 7u, 1025u, 50257u}) {
        for (uint64_t ub : {8 * 1024 + 24 * 16ull, 192 * 1024ull}) {
            const int32_t ks[] = {1, 5, static_cast<int32_t>(vocab), static_cast<int32_t>(vocab) + 10};
            for (int32_t k : ks) {
                for (float p : {0.f, 0.3f, 0.9f, 1.f}) {
                    CheckRow(vocab, ub, k, p, true, true, &rng);
                    CheckRow(vocab, ub, k, p, true, false, &rng);
                    CheckRow(vocab, ub, k, p, false, true, &rng);
                }
            }
        }
    }
}

TEST(KernelRow, EdgeCasesExactly) {
    TilingParams t;
    ASSERT_EQ(ComputeTiling(1, 4, 4, 1, 192 * 1024, true, true, &t), 0);
    const float sorted[] = {1.f, 2.f, 2.f, 3.f};
    const int32_t idx[] = {3, 0, 2, 1};
    float out[4];
    const float inf = std::numeric_limits<float>::infinity();
    KernelRow(t, sorted, idx, 2, 1.f, out);  // k = 2: ties at the threshold (2, 2) survive with 3
    EXPECT_EQ(out[3], -inf);
    EXPECT_EQ(out[0], 2.f);
    EXPECT_EQ(out[2], 2.f);
    EXPECT_EQ(out[1], 3.f);
    KernelRow(t, sorted, idx, 4, 0.f, out);  // p = 0: only the largest
    EXPECT_EQ(out[1], 3.f);
    EXPECT_EQ(out[0], -inf);
    EXPECT_EQ(out[2], -inf);
    EXPECT_EQ(out[3], -inf);
}

}  // namespace
}  // namespace apply_top_k_top_p
