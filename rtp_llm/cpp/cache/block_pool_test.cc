#include "rtp_llm/cpp/cache/block_pool.h"

#include <gtest/gtest.h>

#include <set>

#include "rtp_llm/cpp/cache/errors.h"

namespace rtp_llm {
namespace {

TEST(BlockPool, NeverHandsOutThePaddingBlock) {
    BlockPool pool(4);
    std::set<int32_t> got;
    for (int i = 0; i < 3; ++i) got.insert(pool.allocate());
    EXPECT_EQ(got, (std::set<int32_t>{1, 2, 3}));
    EXPECT_THROW(pool.allocate(), OutOfBlocksError);
}

TEST(BlockPool, RejectsTooSmallPools) {
    EXPECT_THROW(BlockPool(1), std::invalid_argument);
    EXPECT_THROW(BlockPool(0), std::invalid_argument);
}

TEST(BlockPool, CountsAlwaysAddUp) {
    BlockPool pool(6);
    EXPECT_EQ(pool.num_usable(), 5);
    EXPECT_EQ(pool.num_free(), 5);
    int32_t a = pool.allocate(), b = pool.allocate();
    EXPECT_EQ(pool.num_used(), 2);
    pool.set_cached(a, true);
    pool.decref(a);
    EXPECT_EQ(pool.num_evictable(), 1);
    EXPECT_EQ(pool.num_free() + pool.num_used() + pool.num_evictable(), pool.num_usable());
    pool.decref(b);
    EXPECT_EQ(pool.num_free(), 4);
    EXPECT_EQ(pool.num_available(), 5);
}

TEST(BlockPool, BlockIsFreeOnlyWhenNoHolderIsLeft) {
    BlockPool pool(3);
    int32_t a = pool.allocate();
    pool.incref(a);
    EXPECT_EQ(pool.ref_count(a), 2);
    pool.decref(a);
    EXPECT_EQ(pool.num_free(), 1);  // still held once
    pool.decref(a);
    EXPECT_EQ(pool.num_free(), 2);
    EXPECT_THROW(pool.decref(a), std::logic_error);  // double free is loud
}

TEST(BlockPool, CachedBlockSurvivesUntilEvictedAndEvictsLeastRecentFirst) {
    BlockPool pool(4);
    std::vector<int32_t> evicted;
    pool.set_eviction_hook([&](int32_t b) { evicted.push_back(b); });
    int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
    for (int32_t x : {a, b, c}) pool.set_cached(x, true);
    pool.decref(b);
    pool.decref(a);
    pool.decref(c);
    EXPECT_EQ(pool.lru_order(), (std::vector<int32_t>{b, a, c}));
    // Reusing `a` for its prefix takes it off the LRU list; it is not evictable while held.
    pool.incref(a);
    EXPECT_EQ(pool.lru_order(), (std::vector<int32_t>{b, c}));
    EXPECT_EQ(pool.allocate(), b);
    EXPECT_EQ(pool.allocate(), c);
    EXPECT_EQ(evicted, (std::vector<int32_t>{b, c}));
    EXPECT_FALSE(pool.is_cached(b));
    EXPECT_THROW(pool.allocate(), OutOfBlocksError);
}

TEST(BlockPool, FreeBlocksAreUsedBeforeEvictingCachedOnes) {
    BlockPool pool(4);
    int32_t a = pool.allocate();
    pool.set_cached(a, true);
    pool.decref(a);
    int32_t x = pool.allocate(), y = pool.allocate();
    EXPECT_NE(x, a);
    EXPECT_NE(y, a);
    EXPECT_TRUE(pool.is_evictable(a));
    EXPECT_EQ(pool.allocate(), a);
}

TEST(BlockPool, RejectsOutOfRangeIds) {
    BlockPool pool(3);
    EXPECT_THROW(pool.incref(0), std::out_of_range);
    EXPECT_THROW(pool.decref(3), std::out_of_range);
    EXPECT_THROW(pool.incref(1), std::logic_error);  // free, not cached: nothing to share
}

}  // namespace
}  // namespace rtp_llm
