#include "rtp_llm/cpp/cache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "rtp_llm/cpp/cache/errors.h"

namespace rtp_llm {
namespace {

std::vector<int32_t> iota(int n, int start = 100) {
    std::vector<int32_t> v(n);
    std::iota(v.begin(), v.end(), start);
    return v;
}

void expect_accounting(const KVCacheManager& m) {
    auto s = m.stats();
    EXPECT_EQ(s.free_blocks + s.used_blocks + s.cached_blocks, s.total_blocks);
}

TEST(KVCacheManager, SlotMappingFollowsTheBlockTable) {
    KVCacheManager m(16, 4);
    auto prompt = iota(10);
    EXPECT_EQ(m.add_sequence(1, prompt.data(), 10), 0);
    std::vector<int32_t> slots(10);
    EXPECT_TRUE(m.append_slots(1, 10, slots.data()).empty());
    auto table = m.block_table(1);
    ASSERT_EQ(table.size(), 3u);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(slots[i], table[i / 4] * 4 + i % 4);
    EXPECT_EQ(m.num_slots(1), 10);
    expect_accounting(m);
}

TEST(KVCacheManager, ChunkedPrefillThenDecode) {
    KVCacheManager m(16, 4);
    auto prompt = iota(7);
    m.add_sequence(1, prompt.data(), 7);
    std::vector<int32_t> s(7);
    m.append_slots(1, 3, s.data());
    m.append_slots(1, 4, s.data() + 3);
    int64_t id = 1;
    int32_t tok = 5, slot = -1;
    m.append_decode(&id, 1, &tok, &slot);
    auto table = m.block_table(1);
    EXPECT_EQ(slot, table[1] * 4 + 3);
    EXPECT_EQ(m.num_tokens(1), 8);
    // More slots than known tokens is a caller bug.
    EXPECT_THROW(m.append_slots(1, 1, &slot), SequenceError);
}

TEST(KVCacheManager, PrefixHitReusesWholeBlocksAndNeverTheLastToken) {
    KVCacheManager m(32, 4);
    auto a = iota(12);
    m.add_sequence(1, a.data(), 12);
    std::vector<int32_t> s(12);
    m.append_slots(1, 12, s.data());
    auto table_a = m.block_table(1);

    // Same 12 tokens: only 2 blocks (8 tokens) are reused, the last token is recomputed.
    EXPECT_EQ(m.match_prefix(a.data(), 12), 8);
    // Shares 9 tokens: 2 whole blocks.
    auto b = iota(9);
    b.push_back(1);
    b.push_back(2);
    EXPECT_EQ(m.add_sequence(2, b.data(), 11), 8);
    auto table_b = m.block_table(2);
    ASSERT_EQ(table_b.size(), 2u);
    EXPECT_EQ(table_b[0], table_a[0]);
    EXPECT_EQ(table_b[1], table_a[1]);
    EXPECT_EQ(m.ref_count(table_a[0]), 2);
    EXPECT_EQ(m.num_slots(2), 8);
    // Differs in the first block: nothing.
    auto c = iota(12);
    c[1] = 0;
    EXPECT_EQ(m.match_prefix(c.data(), 12), 0);
    // Another extra key: nothing.
    EXPECT_EQ(m.match_prefix(a.data(), 12, 42), 0);
    auto st = m.stats();
    EXPECT_EQ(st.prefix_query_tokens, 23);
    EXPECT_EQ(st.prefix_hit_tokens, 8);
}

TEST(KVCacheManager, FreedPrefixStaysCachedUntilEvicted) {
    KVCacheManager m(4, 2);  // 3 usable blocks
    auto a = iota(5);
    m.add_sequence(1, a.data(), 5);
    std::vector<int32_t> s(5);
    m.append_slots(1, 5, s.data());
    m.free(1);
    auto st = m.stats();
    EXPECT_EQ(st.cached_blocks, 2);  // two full blocks
    EXPECT_EQ(st.free_blocks, 1);
    EXPECT_EQ(m.match_prefix(a.data(), 5), 4);
    // A different prompt of 6 tokens needs all 3 blocks: both cached blocks are evicted.
    auto b = iota(6, 500);
    EXPECT_TRUE(m.can_allocate(b.data(), 6, 6));
    m.add_sequence(2, b.data(), 6);
    s.resize(6);  // six slots written (AddressSanitizer caught the five-slot buffer)
    m.append_slots(2, 6, s.data());
    EXPECT_EQ(m.match_prefix(a.data(), 5), 0);
    expect_accounting(m);
}

TEST(KVCacheManager, AddWithoutReuseComputesEverythingAndKeepsTheCacheConsistent) {
    KVCacheManager m(16, 2);
    auto a = iota(5);
    m.add_sequence(1, a.data(), 5);
    std::vector<int32_t> s(5);
    m.append_slots(1, 5, s.data());
    m.free(1);
    EXPECT_EQ(m.match_prefix(a.data(), 5), 4);
    // The same prompt without reuse: nothing taken, fresh blocks for every token.
    EXPECT_EQ(m.add_sequence(2, a.data(), 5, 0, false), 0);
    EXPECT_EQ(m.num_slots(2), 0);
    std::vector<int32_t> s2(5);
    m.append_slots(2, 5, s2.data());
    for (int i = 0; i < 4; ++i) EXPECT_NE(s2[i], s[i]);  // not the cached blocks
    m.free(2);
    EXPECT_EQ(m.match_prefix(a.data(), 5), 4);  // the first copy still answers
    EXPECT_EQ(m.add_sequence(3, a.data(), 5), 4);
    m.free(3);
    expect_accounting(m);
}

TEST(KVCacheManager, EvictsTheTailOfAFreedPrefixFirst) {
    KVCacheManager m(5, 2);  // 4 usable
    auto a = iota(7);
    m.add_sequence(1, a.data(), 7);
    std::vector<int32_t> s(7);
    m.append_slots(1, 7, s.data());  // blocks: 3 full + 1 partial
    m.free(1);
    // One new block is needed: the free one first, then the prefix's tail, never its head.
    auto b = iota(4, 900);
    m.add_sequence(2, b.data(), 4);
    m.append_slots(2, 4, s.data());  // 2 blocks: the free one + one eviction
    EXPECT_EQ(m.match_prefix(a.data(), 7), 4);  // blocks 1 and 2 of the prefix survive
}

TEST(KVCacheManager, CanAllocateCountsMatchedEvictableBlocksOnce) {
    KVCacheManager m(4, 2);  // 3 usable
    auto a = iota(5);
    m.add_sequence(1, a.data(), 5);
    std::vector<int32_t> s(5);
    m.append_slots(1, 5, s.data());
    m.free(1);  // 2 cached (evictable) + 1 free
    // Reusing 2 cached blocks and needing 1 more: fits.
    EXPECT_TRUE(m.can_allocate(a.data(), 5, 5));
    // Reusing 2 and needing 2 more: the 2 evictable ones are taken by the match, so it does not fit.
    auto longer = iota(7);
    EXPECT_FALSE(m.can_allocate(longer.data(), 7, 7));
}

TEST(KVCacheManager, ExhaustionThrowsAndChangesNothing) {
    KVCacheManager m(3, 2);  // 2 usable
    auto a = iota(6);
    m.add_sequence(1, a.data(), 6);
    std::vector<int32_t> s(6);
    auto before = m.stats();
    EXPECT_THROW(m.append_slots(1, 6, s.data()), OutOfBlocksError);
    auto after = m.stats();
    EXPECT_EQ(after.free_blocks, before.free_blocks);
    EXPECT_EQ(m.num_slots(1), 0);
    EXPECT_EQ(m.block_table(1).size(), 0u);
    m.append_slots(1, 4, s.data());
    int64_t id = 1;
    int32_t tok = 0;
    m.extend_tokens(1, &tok, 0);
    // Decode needs a new block at a boundary.
    EXPECT_THROW(m.append_slots(1, 1, s.data()), OutOfBlocksError);
    EXPECT_EQ(m.num_slots(1), 4);
    (void)id;
}

TEST(KVCacheManager, BatchedDecodeIsAllOrNothing) {
    KVCacheManager m(4, 2);  // 3 usable
    auto a = iota(2), b = iota(2, 50);
    m.add_sequence(1, a.data(), 2);
    m.add_sequence(2, b.data(), 2);
    std::vector<int32_t> s(2);
    m.append_slots(1, 2, s.data());
    m.append_slots(2, 2, s.data());
    std::vector<int64_t> ids = {1, 2};
    std::vector<int32_t> toks = {7, 8}, slots(2);
    EXPECT_THROW(m.append_decode(ids.data(), 2, toks.data(), slots.data()), OutOfBlocksError);
    EXPECT_EQ(m.num_tokens(1), 2);
    EXPECT_EQ(m.num_tokens(2), 2);
    m.free(2);
    m.append_decode(ids.data(), 1, toks.data(), slots.data());
    EXPECT_EQ(slots[0], m.block_table(1)[1] * 2);
}

TEST(KVCacheManager, ForkSharesBlocksAndCopiesThePartialBlockOnWrite) {
    KVCacheManager m(16, 4);
    auto p = iota(6);
    m.add_sequence(1, p.data(), 6);
    std::vector<int32_t> s(6);
    m.append_slots(1, 6, s.data());
    m.fork(1, 2);
    auto t1 = m.block_table(1);
    EXPECT_EQ(m.block_table(2), t1);
    EXPECT_EQ(m.ref_count(t1[0]), 2);
    EXPECT_EQ(m.ref_count(t1[1]), 2);

    int64_t id = 2;
    int32_t tok = 1, slot;
    auto copies = m.append_decode(&id, 1, &tok, &slot);
    ASSERT_EQ(copies.size(), 1u);
    auto t2 = m.block_table(2);
    EXPECT_EQ(copies[0].src, t1[1]);
    EXPECT_EQ(copies[0].dst, t2[1]);
    EXPECT_NE(t2[1], t1[1]);
    EXPECT_EQ(t2[0], t1[0]);  // full block still shared
    EXPECT_EQ(slot, t2[1] * 4 + 2);
    EXPECT_EQ(m.ref_count(t1[1]), 1);
    // The parent now owns its partial block alone: no copy.
    id = 1;
    EXPECT_TRUE(m.append_decode(&id, 1, &tok, &slot).empty());
    EXPECT_EQ(slot, t1[1] * 4 + 2);
    m.free(1);
    m.free(2);
    auto st = m.stats();
    EXPECT_EQ(st.used_blocks, 0);
    expect_accounting(m);
}

TEST(KVCacheManager, UnknownAndDuplicateIdsRaiseWithTheId) {
    KVCacheManager m(8, 2);
    auto a = iota(2);
    m.add_sequence(7, a.data(), 2);
    EXPECT_THROW(m.add_sequence(7, a.data(), 2), SequenceError);
    m.free(7);
    try {
        m.free(7);
        FAIL() << "double free did not throw";
    } catch (const SequenceError& e) {
        EXPECT_NE(std::string(e.what()).find("7"), std::string::npos);
    }
    EXPECT_THROW(m.block_table(99), SequenceError);
    EXPECT_THROW(m.fork(99, 100), SequenceError);
}

TEST(KVCacheManager, FillBlockTablesPadsWithBlockZero) {
    KVCacheManager m(16, 2);
    auto a = iota(5), b = iota(1, 40);
    m.add_sequence(1, a.data(), 5);
    m.add_sequence(2, b.data(), 1);
    std::vector<int32_t> s(5);
    m.append_slots(1, 5, s.data());
    m.append_slots(2, 1, s.data());
    std::vector<int64_t> ids = {2, 1};
    std::vector<int32_t> out(8, -1);
    m.fill_block_tables(ids.data(), 2, out.data(), 4);
    auto t1 = m.block_table(1), t2 = m.block_table(2);
    EXPECT_EQ(out, (std::vector<int32_t>{t2[0], 0, 0, 0, t1[0], t1[1], t1[2], 0}));
    EXPECT_THROW(m.fill_block_tables(ids.data(), 2, out.data(), 2), SequenceError);
}

TEST(KVCacheManager, PrefixCacheOffMeansNoSharing) {
    KVCacheManager m(16, 2, /*enable_prefix_cache=*/false);
    auto a = iota(6);
    std::vector<int32_t> s(6);
    m.add_sequence(1, a.data(), 6);
    m.append_slots(1, 6, s.data());
    m.free(1);
    EXPECT_EQ(m.stats().cached_blocks, 0);
    EXPECT_EQ(m.add_sequence(2, a.data(), 6), 0);
}

TEST(KVCacheManager, IdenticalConcurrentPrefixesDeduplicate) {
    KVCacheManager m(16, 2);
    auto a = iota(4);
    std::vector<int32_t> s(4);
    m.add_sequence(1, a.data(), 4);
    m.add_sequence(2, a.data(), 4);  // nothing cached yet: both compute
    m.append_slots(1, 4, s.data());
    m.append_slots(2, 4, s.data());
    auto t1 = m.block_table(1), t2 = m.block_table(2);
    EXPECT_TRUE(m.is_cached(t1[0]));
    EXPECT_FALSE(m.is_cached(t2[0]));
    m.free(2);
    m.free(1);
    // Sequence 2's private duplicate went back to the free list, not the cache.
    auto st = m.stats();
    EXPECT_EQ(st.cached_blocks, 2);
    EXPECT_EQ(m.match_prefix(a.data(), 4), 2);
    auto longer = iota(6);
    EXPECT_EQ(m.match_prefix(longer.data(), 6), 4);  // chain continues through sequence 1's blocks
}

TEST(KVCacheManager, RejectedDraftsLeaveNoBlockAndNoCacheEntry) {
    KVCacheManager m(16, 4);
    auto prompt = iota(6);
    m.add_sequence(1, prompt.data(), 6);
    std::vector<int32_t> s(6);
    m.append_slots(1, 6, s.data());  // blocks 0..1: one full (cached), one with 2 of 4
    const auto before = m.stats();
    // The last sampled token and 5 drafts: positions 6..11 fill the second block and a third.
    std::vector<int32_t> drafts = {7, 8, 9, 10, 11}, slots(6);
    m.append_speculative(1, 6, drafts.data(), 5, slots.data());
    auto table = m.block_table(1);
    ASSERT_EQ(table.size(), 3u);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(slots[i], table[(6 + i) / 4] * 4 + (6 + i) % 4);
    EXPECT_FALSE(m.is_cached(table[1]));  // full, but of drafts not yet accepted
    EXPECT_EQ(m.stats().cache_entries, before.cache_entries);
    // One draft accepted: 6 prompt + the last token + 1 draft = 8 tokens, exactly two full blocks.
    m.truncate(1, 8);
    EXPECT_EQ(m.num_tokens(1), 8);
    EXPECT_EQ(m.num_slots(1), 8);
    ASSERT_EQ(m.block_table(1).size(), 2u);
    EXPECT_TRUE(m.is_cached(table[1]));
    EXPECT_EQ(m.ref_count(table[2]), 0);
    EXPECT_EQ(m.stats().used_blocks, before.used_blocks);
    expect_accounting(m);
    // Decoding goes on from the kept tokens; nothing may be cut out of a cached block.
    EXPECT_THROW(m.truncate(1, 7), SequenceError);
    int64_t id = 1;
    int32_t tok = 12, slot = -1;
    m.append_decode(&id, 1, &tok, &slot);
    EXPECT_EQ(slot, m.block_table(1)[2] * 4);
    m.free(1);
    EXPECT_EQ(m.stats().used_blocks, 0);
    expect_accounting(m);
}

TEST(KVCacheManager, SpeculationNeedsEveryBlockOrChangesNothing) {
    KVCacheManager m(3, 4);  // two usable blocks
    auto prompt = iota(4);
    m.add_sequence(1, prompt.data(), 4);
    std::vector<int32_t> s(4);
    m.append_slots(1, 4, s.data());
    std::vector<int32_t> drafts(8, 1), slots(9);
    EXPECT_THROW(m.append_speculative(1, 5, drafts.data(), 8, slots.data()), OutOfBlocksError);
    EXPECT_EQ(m.num_tokens(1), 4);
    EXPECT_EQ(m.block_table(1).size(), 1u);
    m.append_speculative(1, 5, drafts.data(), 3, slots.data());
    EXPECT_EQ(m.num_tokens(1), 8);
    m.truncate(1, 5);  // every draft rejected
    EXPECT_EQ(m.block_table(1).size(), 2u);  // the last token's block stays
    EXPECT_EQ(m.num_slots(1), 5);
    expect_accounting(m);
}

TEST(KVCacheManager, WithoutAPrefixCacheTruncateMayCutAFullBlock) {
    KVCacheManager m(8, 4, /*enable_prefix_cache=*/false);
    auto prompt = iota(9);
    m.add_sequence(1, prompt.data(), 9);
    std::vector<int32_t> s(9);
    m.append_slots(1, 9, s.data());
    m.truncate(1, 3);
    EXPECT_EQ(m.block_table(1).size(), 1u);
    EXPECT_EQ(m.num_slots(1), 3);
    std::vector<int32_t> more = {1, 2, 3, 4, 5};
    m.extend_tokens(1, more.data(), 5);
    std::vector<int32_t> slots(5);
    m.append_slots(1, 5, slots.data());
    EXPECT_EQ(slots[0], m.block_table(1)[0] * 4 + 3);
    expect_accounting(m);
}

}  // namespace
}  // namespace rtp_llm
