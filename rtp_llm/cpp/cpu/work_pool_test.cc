// rtp_llm::parallel_for: every index runs exactly once, in ranges of at least `grain`, ending on pieces of the grain,
// on several threads; a loop inside a chunk runs inline; an exception in a chunk reaches the caller; concurrent
// callers both finish; back-to-back loops of different sizes never run a chunk twice or after their call returned;
// the prefetch hints name chunks that exist (or none).
#include "rtp_llm/cpp/cpu/work_pool.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace rtp_llm {
namespace {

TEST(WorkPool, EveryIndexOnceInRangesOfAtLeastTheGrain) {
    omp_set_num_threads(3);
    for (int64_t n : {1, 2, 7, 64, 1000, 4099}) {
        for (int64_t grain : {1, 5, 256}) {
            std::vector<std::atomic<int>> hits(n);
            std::mutex mu;
            std::vector<std::pair<int64_t, int64_t>> ranges;
            parallel_for(10, 10 + n, grain, [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) hits[i - 10]++;
                std::lock_guard<std::mutex> lk(mu);
                ranges.emplace_back(b, e);
            });
            for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
            for (auto [b, e] : ranges) EXPECT_TRUE(e - b >= grain || e == 10 + n) << b << ".." << e;
        }
    }
}

// The thread that finishes first waits for the others' last pieces: those are the grain, not a whole chunk.
TEST(WorkPool, TheLoopEndsOnPiecesOfTheGrain) {
    omp_set_num_threads(3);
    for (int64_t n : {1000, 4099}) {
        for (int64_t grain : {1, 5}) {
            std::mutex mu;
            std::vector<std::pair<int64_t, int64_t>> ranges;
            parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
                std::lock_guard<std::mutex> lk(mu);
                ranges.emplace_back(b, e);
            });
            std::sort(ranges.begin(), ranges.end());
            ASSERT_GE(ranges.size(), 8u);
            EXPECT_LE(ranges.back().second - ranges.back().first, grain) << "n=" << n;
            // the first pieces stay whole chunks (n / (2 per thread)), so most of the loop pays one claim per chunk
            EXPECT_GE(ranges.front().second - ranges.front().first, n / 6) << "n=" << n;
            EXPECT_LE(ranges.size(), 32u) << "n=" << n;
        }
    }
}

// parallel_for_next_begin inside a chunk: -1 or the begin of a chunk after it, one this loop has; -1 outside a
// loop, in an inline loop and in a loop nested in a chunk. parallel_for_first_begin: the caller's first chunk
// begins at 0, a worker's at its slot's chunk, never past n.
TEST(WorkPool, PrefetchHintsNameChunksOfTheLoop) {
    omp_set_num_threads(2);
    EXPECT_EQ(parallel_for_next_begin(), -1);
    EXPECT_EQ(parallel_for_first_begin(20, 1), 0);  // called here, outside the pool: the caller's chunk
    for (int64_t n : {2, 12, 20, 128, 1000}) {
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        std::vector<std::pair<int64_t, int64_t>> hints;  // (chunk begin, next begin)
        std::vector<int64_t> nested, firsts;
        parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
            const int64_t next = parallel_for_next_begin(), first = parallel_for_first_begin(n, 1);
            int64_t inner = -2;
            parallel_for(0, 4, 1, [&](int64_t, int64_t) { inner = parallel_for_next_begin(); });
            std::lock_guard<std::mutex> lk(mu);
            ranges.emplace_back(b, e);
            hints.emplace_back(b, next);
            nested.push_back(inner);
            firsts.push_back(first);
        });
        std::set<int64_t> begins;
        for (auto [b, e] : ranges) begins.insert(b);
        bool some_next = false;
        for (auto [b, next] : hints) {
            if (next == -1) continue;
            some_next = true;
            EXPECT_TRUE(begins.count(next)) << "n=" << n << ": " << next << " begins no chunk";
            EXPECT_GT(next, b) << "n=" << n << ": chunks are claimed in order";
        }
        if (ranges.size() > 2) EXPECT_TRUE(some_next) << "n=" << n;
        for (int64_t inner : nested) EXPECT_EQ(inner, -1) << "n=" << n;
        for (int64_t f : firsts) EXPECT_TRUE(f == -1 || begins.count(f)) << "n=" << n << ": first " << f;
    }
    omp_set_num_threads(1);
    parallel_for(0, 100, 1, [&](int64_t, int64_t) { EXPECT_EQ(parallel_for_next_begin(), -1); });
    EXPECT_EQ(parallel_for_first_begin(100, 1), 0);
}

TEST(WorkPool, UsesMoreThanOneThreadAndRunsNestedLoopsInline) {
    omp_set_num_threads(2);
    std::set<std::thread::id> ids;
    std::mutex mu;
    std::atomic<int64_t> inner{0};
    // Until the worker has taken a chunk at least once (it must, within seconds, even on a loaded machine).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
        {
            std::lock_guard<std::mutex> lk(mu);
            if (ids.size() >= 2) break;
        }
        parallel_for(0, 64, 1, [&](int64_t b, int64_t e) {
            const auto outer = std::this_thread::get_id();
            parallel_for(0, 100, 1, [&](int64_t ib, int64_t ie) {
                EXPECT_EQ(std::this_thread::get_id(), outer);  // inline, not handed to another thread
                inner += ie - ib;
            });
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            std::lock_guard<std::mutex> lk(mu);
            ids.insert(outer);
        });
    }
    EXPECT_EQ(ids.size(), 2u);
    EXPECT_EQ(inner.load() % 100, 0);
}

TEST(WorkPool, AnExceptionInAChunkReachesTheCaller) {
    omp_set_num_threads(2);
    EXPECT_THROW(parallel_for(0, 100, 1,
                              [](int64_t b, int64_t) {
                                  if (b == 0) throw std::runtime_error("chunk failed");
                              }),
                 std::runtime_error);
    std::atomic<int64_t> sum{0};  // the pool still works afterwards
    parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) { sum += e - b; });
    EXPECT_EQ(sum.load(), 1000);
}

TEST(WorkPool, ConcurrentCallersBothFinish) {
    omp_set_num_threads(2);
    std::atomic<int64_t> a{0}, b{0};
    std::thread other([&] {
        for (int i = 0; i < 200; ++i) parallel_for(0, 500, 1, [&](int64_t s, int64_t e) { a += e - s; });
    });
    for (int i = 0; i < 200; ++i) parallel_for(0, 500, 1, [&](int64_t s, int64_t e) { b += e - s; });
    other.join();
    EXPECT_EQ(a.load(), 200 * 500);
    EXPECT_EQ(b.load(), 200 * 500);
}

// Loops of 2 and then 6 chunks back to back, more threads than cores: a worker that read the last claim of one
// loop and the next loop's larger chunk count before the next loop was published once claimed a chunk past the
// end of the finished loop, ran a chunk twice and let its caller return while it still ran (a segfault in the
// engine when the chunk read the caller's freed locals). Each loop's record outlives the test, so such a chunk is
// counted, not a crash.
TEST(WorkPool, BackToBackLoopsOfDifferentSizesRunEachChunkOnceAndInTime) {
    omp_set_num_threads(3);
    struct Record {
        std::atomic<bool> live{false};
        std::atomic<int> hits[6] = {};
    };
    constexpr int kLoops = 300000;
    std::vector<Record> records(kLoops);
    std::atomic<int64_t> late{0};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int loops = 0;
    for (; loops < kLoops && std::chrono::steady_clock::now() < deadline; ++loops) {
        Record& r = records[loops];
        const int64_t n = loops % 2 ? 6 : 2;
        r.live = true;
        parallel_for(0, n, 1, [&r, &late](int64_t b, int64_t e) {
            if (!r.live.load()) ++late;
            for (int64_t i = b; i < e; ++i) r.hits[i]++;
        });
        r.live = false;
    }
    // chunks still running late finish within this pause
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(late.load(), 0) << "chunks ran after their parallel_for returned";
    int64_t wrong = 0;
    for (int l = 0; l < loops; ++l)
        for (int i = 0; i < (l % 2 ? 6 : 2); ++i) wrong += records[l].hits[i].load() != 1;
    EXPECT_EQ(wrong, 0) << "indexes not run exactly once, over " << loops << " loops";
}

}  // namespace
}  // namespace rtp_llm
