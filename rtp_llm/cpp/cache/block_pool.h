// BlockPool: reference-counted KV-cache blocks with O(1) allocate/free and LRU eviction of cached blocks.
//
// Block 0 is the padding block: never handed out, so a zero in a block table is always safe to read.
// Every other block is in exactly one state:
//   free       ref == 0, not cached              (on the free stack)
//   used       ref >= 1                           (held by one or more sequences; may also be cached)
//   evictable  ref == 0, cached                   (on the LRU list; reusable for its prefix, or evictable)
// so free + used + evictable == usable (num_blocks - 1) at all times.
//
// Not thread-safe by itself: KVCacheManager serialises every call.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace rtp_llm {

class BlockPool {
public:
    static constexpr int32_t kPaddingBlock = 0;

    // num_blocks counts the padding block; at least 2.
    explicit BlockPool(int32_t num_blocks);

    // A block with ref count 1: a free one if any, else the least recently released evictable block
    // (the eviction hook is told first so the cache drops its entry). Throws OutOfBlocksError.
    int32_t allocate();

    void incref(int32_t block);  // an evictable block becomes used again (leaves the LRU list)
    void decref(int32_t block);  // at 0: cached -> LRU tail (most recent), else -> free stack

    // Marks whether the prefix cache holds this block (only used blocks may become cached).
    void set_cached(int32_t block, bool cached);

    // Called with the block id just before an evictable block is reused.
    void set_eviction_hook(std::function<void(int32_t)> hook) { on_evict_ = std::move(hook); }

    int32_t num_blocks() const { return num_blocks_; }
    int32_t num_usable() const { return num_blocks_ - 1; }
    int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
    int32_t num_evictable() const { return num_evictable_; }
    int32_t num_used() const { return num_usable() - num_free() - num_evictable(); }
    int32_t num_available() const { return num_free() + num_evictable(); }

    int32_t ref_count(int32_t block) const { return ref_[check(block)]; }
    bool is_cached(int32_t block) const { return cached_[check(block)] != 0; }
    bool is_evictable(int32_t block) const;

    // Evictable blocks, least recently released first (for tests and debugging).
    std::vector<int32_t> lru_order() const;

private:
    int32_t check(int32_t block) const;
    void lru_push_back(int32_t block);
    void lru_remove(int32_t block);

    int32_t num_blocks_;
    std::vector<int32_t> ref_;
    std::vector<uint8_t> cached_;
    std::vector<int32_t> free_;  // stack: last freed is reused first (warm memory)
    // Intrusive doubly linked LRU list over evictable blocks; index num_blocks_ is the sentinel.
    std::vector<int32_t> prev_, next_;
    int32_t num_evictable_ = 0;
    std::function<void(int32_t)> on_evict_;
};

}  // namespace rtp_llm
