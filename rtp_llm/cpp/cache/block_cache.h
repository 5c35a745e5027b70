// BlockCache: prefix reuse by whole blocks.
//
// A cached block is keyed by (parent key, the block's token ids, extra key). The parent key is the
// unique id this cache gave the previous block of the same prefix (0 for the first block), so a key
// chains the whole prefix before it. The 64-bit hash of that triple only picks a bucket: a lookup
// compares the parent key, the extra key and every token id, so a hash collision can never return
// another prefix's KV (the tests force collisions with a 1-bit hash to prove it).
//
// Keys are never reused. When a block is evicted, its descendants become unreachable and age out of
// the LRU like any other unreferenced block.
//
// Not thread-safe by itself: KVCacheManager serialises every call.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace rtp_llm {

class BlockCache {
public:
    static constexpr uint64_t kRootKey = 0;

    // hash_bits < 64 truncates the bucket hash: only for tests that need collisions.
    BlockCache(int32_t num_blocks, int32_t block_size, int hash_bits = 64);

    struct Hit {
        int32_t block = -1;  // -1: miss
        uint64_t key = 0;    // this block's key, the parent key of the next block
    };

    // The cached block holding tokens[0:block_size] after the prefix whose last key is parent_key.
    Hit lookup(uint64_t parent_key, const int32_t* tokens, uint64_t extra_key) const;

    // Registers `block` (full, KV written or being written this step). When an identical entry
    // exists already, nothing is inserted and the existing hit is returned (the caller keeps its own
    // block uncached); otherwise returns {block, new key}.
    Hit insert(int32_t block, uint64_t parent_key, const int32_t* tokens, uint64_t extra_key);

    // Drops the entry of an evicted block.
    void erase(int32_t block);

    bool contains(int32_t block) const { return key_[block] != 0; }
    int32_t size() const { return size_; }
    int32_t block_size() const { return block_size_; }

private:
    uint64_t bucket_hash(uint64_t parent_key, const int32_t* tokens, uint64_t extra_key) const;
    bool same(int32_t block, uint64_t parent_key, const int32_t* tokens, uint64_t extra_key) const;

    int32_t block_size_;
    uint64_t hash_mask_;
    uint64_t next_key_ = 1;
    int32_t size_ = 0;
    // Per block (indexed by block id): its key (0 = not cached), parent key, extra key, bucket hash,
    // next block in the same bucket, and its token ids.
    std::vector<uint64_t> key_, parent_, extra_, hash_;
    std::vector<int32_t> bucket_next_;
    std::vector<int32_t> tokens_;
    absl::flat_hash_map<uint64_t, int32_t> buckets_;  // hash -> first block of the chain
};

}  // namespace rtp_llm
