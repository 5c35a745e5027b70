// The AVX-512 reductions that return many sums at once (reduce8v, reduce16v) must give each vector's sum in
// reduce1's tree, bit for bit: the kernels mix them (8 or 16 keys / weight rows per pass, one for a tail), and a
// row's result may not depend on which of them summed it (batch invariance, decode = prefill attention).
#include "rtp_llm/cpp/cpu/vec/avx512_sums.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace rtp_llm {
namespace {

// Lanes of widely different magnitudes and signs, so that another association order gives other bits.
std::vector<float> order_sensitive(int n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> mant(1.f, 2.f), expo(-24.f, 24.f);
    std::vector<float> v(n);
    for (auto& x : v) x = (rng() & 1 ? -1.f : 1.f) * mant(rng) * std::exp2(std::round(expo(rng)));
    return v;
}

RTP_AVX512 void sums(const float* lanes, float* tree, float* by8, float* by16) {
    __m512 a[16];
    for (int i = 0; i < 16; ++i) a[i] = _mm512_loadu_ps(lanes + 16 * i);
    for (int i = 0; i < 16; ++i) tree[i] = avx512::reduce1(a[i]);
    _mm256_storeu_ps(by8, avx512::reduce8v(a));
    _mm256_storeu_ps(by8 + 8, avx512::reduce8v(a + 8));
    _mm512_storeu_ps(by16, avx512::reduce16v(a));
}

TEST(Avx512Reductions, ManyAtOnceSumEachVectorInReduce1sTree) {
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq")) GTEST_SKIP() << "no AVX-512";
    int order_mattered = 0;
    for (unsigned seed = 0; seed < 200; ++seed) {
        const auto lanes = order_sensitive(256, seed);
        float tree[16], by8[16], by16[16];
        sums(lanes.data(), tree, by8, by16);
        for (int i = 0; i < 16; ++i) {
            ASSERT_EQ(std::memcmp(&tree[i], &by8[i], 4), 0) << "reduce8v, vector " << i << " seed " << seed;
            ASSERT_EQ(std::memcmp(&tree[i], &by16[i], 4), 0) << "reduce16v, vector " << i << " seed " << seed;
            float in_order = 0.f;
            for (int l = 0; l < 16; ++l) in_order += lanes[16 * i + l];
            order_mattered += in_order != tree[i];
        }
    }
    // The data would have caught another order: a plain left-to-right sum differs from the tree often.
    EXPECT_GT(order_mattered, 1000);
}

}  // namespace
}  // namespace rtp_llm
