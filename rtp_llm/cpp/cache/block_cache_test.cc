#include "rtp_llm/cpp/cache/block_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace rtp_llm {
namespace {

TEST(BlockCache, HitsOnlyTheSamePrefix) {
    BlockCache cache(8, 2);
    std::vector<int32_t> t1 = {1, 2}, t2 = {3, 4};
    auto a = cache.insert(1, BlockCache::kRootKey, t1.data(), 0);
    auto b = cache.insert(2, a.key, t2.data(), 0);
    EXPECT_EQ(cache.lookup(BlockCache::kRootKey, t1.data(), 0).block, 1);
    EXPECT_EQ(cache.lookup(a.key, t2.data(), 0).block, 2);
    // Same tokens after another parent: a miss.
    EXPECT_EQ(cache.lookup(BlockCache::kRootKey, t2.data(), 0).block, -1);
    EXPECT_EQ(cache.lookup(b.key, t2.data(), 0).block, -1);
    // Same tokens and parent, other extra key (e.g. another LoRA): a miss.
    EXPECT_EQ(cache.lookup(BlockCache::kRootKey, t1.data(), 7).block, -1);
}

TEST(BlockCache, IdenticalInsertReturnsTheExistingEntry) {
    BlockCache cache(8, 2);
    std::vector<int32_t> t = {5, 6};
    auto first = cache.insert(3, BlockCache::kRootKey, t.data(), 0);
    auto second = cache.insert(4, BlockCache::kRootKey, t.data(), 0);
    EXPECT_EQ(second.block, 3);
    EXPECT_EQ(second.key, first.key);
    EXPECT_FALSE(cache.contains(4));
    EXPECT_EQ(cache.size(), 1);
}

// A one-bit bucket hash puts every entry into one of two buckets: lookups must still compare the
// parent, the extra key and the tokens, and never return another prefix's block.
TEST(BlockCache, CollisionsNeverReturnTheWrongBlock) {
    const int32_t n = 64;
    BlockCache cache(n, 3, /*hash_bits=*/1);
    std::vector<BlockCache::Hit> hits(n);
    uint64_t parent = BlockCache::kRootKey;
    for (int32_t b = 1; b < n; ++b) {
        std::vector<int32_t> t = {b, b * 7, b % 3};
        hits[b] = cache.insert(b, b % 2 ? BlockCache::kRootKey : parent, t.data(), b % 5);
        parent = hits[b].key;
    }
    parent = BlockCache::kRootKey;
    for (int32_t b = 1; b < n; ++b) {
        std::vector<int32_t> t = {b, b * 7, b % 3};
        uint64_t p = b % 2 ? BlockCache::kRootKey : parent;
        EXPECT_EQ(cache.lookup(p, t.data(), b % 5).block, b);
        std::vector<int32_t> other = {b, b * 7, b % 3 + 1};
        EXPECT_EQ(cache.lookup(p, other.data(), b % 5).block, -1);
        EXPECT_EQ(cache.lookup(p, t.data(), b % 5 + 1).block, -1);
        parent = hits[b].key;
    }
}

TEST(BlockCache, EraseFromTheMiddleOfACollisionChain) {
    BlockCache cache(8, 1, /*hash_bits=*/1);
    std::vector<int32_t> toks = {10, 11, 12, 13, 14, 15};
    for (int32_t b = 1; b <= 6; ++b) cache.insert(b, BlockCache::kRootKey, &toks[b - 1], 0);
    cache.erase(3);
    cache.erase(1);
    EXPECT_EQ(cache.size(), 4);
    for (int32_t b = 1; b <= 6; ++b) {
        int32_t want = (b == 1 || b == 3) ? -1 : b;
        EXPECT_EQ(cache.lookup(BlockCache::kRootKey, &toks[b - 1], 0).block, want) << "block " << b;
    }
    // An erased block may be cached again with other content.
    cache.insert(3, BlockCache::kRootKey, &toks[0], 0);
    EXPECT_EQ(cache.lookup(BlockCache::kRootKey, &toks[0], 0).block, 3);
}

TEST(BlockCache, KeysAreNeverReused) {
    BlockCache cache(4, 1);
    int32_t t = 9;
    auto a = cache.insert(1, BlockCache::kRootKey, &t, 0);
    cache.erase(1);
    auto b = cache.insert(1, BlockCache::kRootKey, &t, 0);
    EXPECT_NE(a.key, b.key);  // a child chained to the old entry cannot be reached through the new one
}

}  // namespace
}  // namespace rtp_llm
