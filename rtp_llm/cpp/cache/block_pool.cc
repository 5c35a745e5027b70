#include "rtp_llm/cpp/cache/block_pool.h"

#include <string>

#include "rtp_llm/cpp/cache/errors.h"

namespace rtp_llm {

BlockPool::BlockPool(int32_t num_blocks)
    : num_blocks_(num_blocks),
      ref_(num_blocks > 0 ? num_blocks : 0, 0),
      cached_(num_blocks > 0 ? num_blocks : 0, 0),
      prev_(num_blocks > 0 ? num_blocks + 1 : 1, -1),
      next_(num_blocks > 0 ? num_blocks + 1 : 1, -1) {
    if (num_blocks < 2) {
        throw std::invalid_argument("BlockPool needs at least 2 blocks (block 0 is the padding block), got " +
                                    std::to_string(num_blocks));
    }
    prev_[num_blocks_] = next_[num_blocks_] = num_blocks_;
    free_.reserve(num_blocks_ - 1);
    // Pushed high to low so the first allocations return 1, 2, 3, ... (readable tests and logs).
    for (int32_t b = num_blocks_ - 1; b >= 1; --b) free_.push_back(b);
}

int32_t BlockPool::check(int32_t block) const {
    if (block <= 0 || block >= num_blocks_) {
        throw std::out_of_range("block id " + std::to_string(block) + " is outside 1.." +
                                std::to_string(num_blocks_ - 1));
    }
    return block;
}

bool BlockPool::is_evictable(int32_t block) const {
    check(block);
    return ref_[block] == 0 && cached_[block];
}

void BlockPool::lru_push_back(int32_t block) {
    const int32_t s = num_blocks_;
    const int32_t last = prev_[s];
    next_[last] = block;
    prev_[block] = last;
    next_[block] = s;
    prev_[s] = block;
    ++num_evictable_;
}

void BlockPool::lru_remove(int32_t block) {
    next_[prev_[block]] = next_[block];
    prev_[next_[block]] = prev_[block];
    prev_[block] = next_[block] = -1;
    --num_evictable_;
}

int32_t BlockPool::allocate() {
    int32_t block;
    if (!free_.empty()) {
        block = free_.back();
        free_.pop_back();
    } else if (num_evictable_ > 0) {
        block = next_[num_blocks_];
        lru_remove(block);
        if (on_evict_) on_evict_(block);
        cached_[block] = 0;
    } else {
        throw OutOfBlocksError("KV cache is out of blocks: all " + std::to_string(num_usable()) +
                               " usable blocks are held by running sequences");
    }
    ref_[block] = 1;
    return block;
}

void BlockPool::incref(int32_t block) {
    check(block);
    if (ref_[block] == 0) {
        if (!cached_[block]) {
            throw std::logic_error("incref of free block " + std::to_string(block));
        }
        lru_remove(block);
    }
    ++ref_[block];
}

void BlockPool::decref(int32_t block) {
    check(block);
    if (ref_[block] <= 0) {
        throw std::logic_error("decref of block " + std::to_string(block) + " whose ref count is already 0");
    }
    if (--ref_[block] == 0) {
        if (cached_[block]) {
            lru_push_back(block);
        } else {
            free_.push_back(block);
        }
    }
}

void BlockPool::set_cached(int32_t block, bool cached) {
    check(block);
    if (ref_[block] == 0) {
        throw std::logic_error("set_cached on unreferenced block " + std::to_string(block));
    }
    cached_[block] = cached ? 1 : 0;
}

std::vector<int32_t> BlockPool::lru_order() const {
    std::vector<int32_t> out;
    out.reserve(num_evictable_);
    for (int32_t b = next_[num_blocks_]; b != num_blocks_; b = next_[b]) out.push_back(b);
    return out;
}

}  // namespace rtp_llm
