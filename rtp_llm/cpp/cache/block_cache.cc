#include "rtp_llm/cpp/cache/block_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace rtp_llm {

namespace {
// splitmix64 finaliser: a cheap, well-mixed step for the bucket hash.
inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}
}  // namespace

BlockCache::BlockCache(int32_t num_blocks, int32_t block_size, int hash_bits)
    : block_size_(block_size),
      hash_mask_(hash_bits >= 64 ? ~0ULL : ((1ULL << hash_bits) - 1)),
      key_(num_blocks, 0),
      parent_(num_blocks, 0),
      extra_(num_blocks, 0),
      hash_(num_blocks, 0),
      bucket_next_(num_blocks, -1),
      tokens_(static_cast<size_t>(num_blocks) * block_size, 0) {
    if (block_size < 1) throw std::invalid_argument("block_size must be >= 1, got " + std::to_string(block_size));
    if (hash_bits < 1) throw std::invalid_argument("hash_bits must be >= 1");
}

uint64_t BlockCache::bucket_hash(uint64_t parent_key, const int32_t* tokens, uint64_t extra_key) const {
    uint64_t h = mix(parent_key ^ mix(extra_key));
    for (int32_t i = 0; i < block_size_; ++i) h = mix(h ^ static_cast<uint32_t>(tokens[i]));
    return h & hash_mask_;
}

bool BlockCache::same(int32_t block, uint64_t parent_key, const int32_t* tokens, uint64_t extra_key) const {
    return parent_[block] == parent_key && extra_[block] == extra_key &&
           std::memcmp(&tokens_[static_cast<size_t>(block) * block_size_], tokens,
                       sizeof(int32_t) * block_size_) == 0;
}

BlockCache::Hit BlockCache::lookup(uint64_t parent_key, const int32_t* tokens, uint64_t extra_key) const {
    const uint64_t h = bucket_hash(parent_key, tokens, extra_key);
    auto it = buckets_.find(h);
    if (it == buckets_.end()) return {};
    for (int32_t b = it->second; b != -1; b = bucket_next_[b]) {
        if (same(b, parent_key, tokens, extra_key)) return {b, key_[b]};
    }
    return {};
}

BlockCache::Hit BlockCache::insert(int32_t block, uint64_t parent_key, const int32_t* tokens, uint64_t extra_key) {
    if (key_[block] != 0) throw std::logic_error("block " + std::to_string(block) + " is cached already");
    const uint64_t h = bucket_hash(parent_key, tokens, extra_key);
    auto [it, inserted] = buckets_.try_emplace(h, -1);
    for (int32_t b = it->second; b != -1; b = bucket_next_[b]) {
        if (same(b, parent_key, tokens, extra_key)) return {b, key_[b]};
    }
    key_[block] = next_key_++;
    parent_[block] = parent_key;
    extra_[block] = extra_key;
    hash_[block] = h;
    std::copy(tokens, tokens + block_size_, &tokens_[static_cast<size_t>(block) * block_size_]);
    bucket_next_[block] = it->second;
    it->second = block;
    ++size_;
    return {block, key_[block]};
}

void BlockCache::erase(int32_t block) {
    if (key_[block] == 0) return;
    auto it = buckets_.find(hash_[block]);
    if (it->second == block) {
        if (bucket_next_[block] == -1) {
            buckets_.erase(it);
        } else {
            it->second = bucket_next_[block];
        }
    } else {
        int32_t b = it->second;
        while (bucket_next_[b] != block) b = bucket_next_[b];
        bucket_next_[b] = bucket_next_[block];
    }
    bucket_next_[block] = -1;
    key_[block] = 0;
    --size_;
}

}  // namespace rtp_llm
