// vec::exp4d / vec::expd1 (the float64 exp of top-p's masses): every lane equals the scalar twin bit for bit, so a
// kernel may compute a value either way; both within 2 ulp of std::exp where the result is normal; the edges.
#include "rtp_llm/cpp/cpu/vec/expd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace rtp_llm {
namespace {

int64_t ulps(double a, double b) {
    int64_t ia, ib;
    std::memcpy(&ia, &a, sizeof(a));
    std::memcpy(&ib, &b, sizeof(b));
    return ia > ib ? ia - ib : ib - ia;
}

std::vector<double> inputs() {
    std::mt19937_64 rng(7);
    std::vector<double> x = {0.0, -0.0, 1e-300, -1e-300, 0.34657359027997264, -0.34657359027997264, -1.0,
                             -707.9999, -708.0, -708.0001, 708.9, 1.0, 30.0};
    std::uniform_real_distribution<double> wide(-708.0, 709.0), narrow(-40.0, 0.0);
    for (int i = 0; i < 200000; ++i) x.push_back(i % 2 ? wide(rng) : narrow(rng));
    for (int i = -1000; i <= 1000; ++i) x.push_back(i * 0.34657359027997264);  // half-ln2 boundaries
    while (x.size() % 4) x.push_back(-2.0);
    return x;
}

TEST(Expd, LanesEqualTheScalarTwinAndStdExpWithin2Ulp) {
    const std::vector<double> x = inputs();
    int64_t worst = 0;
    for (size_t i = 0; i < x.size(); i += 4) {
        double lanes[4];
        _mm256_storeu_pd(lanes, vec::exp4d(_mm256_loadu_pd(x.data() + i)));
        for (int l = 0; l < 4; ++l) {
            const double xi = x[i + l], one = vec::expd1(xi);
            ASSERT_EQ(ulps(lanes[l], one), 0) << "x = " << xi;
            if (xi >= -708.0 && xi <= 709.0) worst = std::max(worst, ulps(one, std::exp(xi)));
        }
    }
    EXPECT_LE(worst, 2);
}

TEST(Expd, Edges) {
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(vec::expd1(0.0), 1.0);
    EXPECT_EQ(vec::expd1(-inf), 0.0);
    EXPECT_EQ(vec::expd1(-708.5), 0.0);
    EXPECT_TRUE(std::isnan(vec::expd1(nan)));
    double lanes[4], in[4] = {0.0, -inf, nan, -708.5};
    _mm256_storeu_pd(lanes, vec::exp4d(_mm256_loadu_pd(in)));
    EXPECT_EQ(lanes[0], 1.0);
    EXPECT_EQ(lanes[1], 0.0);
    EXPECT_TRUE(std::isnan(lanes[2]));
    EXPECT_EQ(lanes[3], 0.0);
}

}  // namespace
}  // namespace rtp_llm
