#include "rtp_llm/cpp/cache/kv_cache_manager.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "rtp_llm/cpp/cache/errors.h"

namespace rtp_llm {

using Lock = std::lock_guard<std::mutex>;

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

KVCacheManager::KVCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_cache, int hash_bits)
    : block_size_(block_size),
      enable_prefix_cache_(enable_prefix_cache),
      pool_(num_blocks),
      cache_(num_blocks, block_size, hash_bits) {
    pool_.set_eviction_hook([this](int32_t block) { cache_.erase(block); });
}

KVCacheManager::Sequence& KVCacheManager::get(int64_t seq_id) {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) throw SequenceError("unknown sequence id " + std::to_string(seq_id));
    return it->second;
}

const KVCacheManager::Sequence& KVCacheManager::get(int64_t seq_id) const {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) throw SequenceError("unknown sequence id " + std::to_string(seq_id));
    return it->second;
}

int64_t KVCacheManager::match_locked(const int32_t* tokens, int64_t n, uint64_t extra_key,
                                     std::vector<int32_t>* blocks, uint64_t* last_key) const {
    *last_key = BlockCache::kRootKey;
    if (!enable_prefix_cache_ || n <= 1) return 0;
    const int64_t max_blocks = (n - 1) / block_size_;  // keep at least the last token to compute
    uint64_t key = BlockCache::kRootKey;
    int64_t matched = 0;
    for (; matched < max_blocks; ++matched) {
        auto hit = cache_.lookup(key, tokens + matched * block_size_, extra_key);
        if (hit.block < 0) break;
        if (blocks) blocks->push_back(hit.block);
        key = hit.key;
    }
    *last_key = key;
    return matched * block_size_;
}

int64_t KVCacheManager::match_prefix(const int32_t* tokens, int64_t n, uint64_t extra_key) const {
    Lock lock(mu_);
    uint64_t key;
    return match_locked(tokens, n, extra_key, nullptr, &key);
}

bool KVCacheManager::can_allocate(const int32_t* tokens, int64_t n, int64_t total_slots, uint64_t extra_key) const {
    Lock lock(mu_);
    std::vector<int32_t> matched;
    uint64_t key;
    match_locked(tokens, n, extra_key, &matched, &key);
    int64_t evictable_matched = 0;
    for (int32_t b : matched) evictable_matched += pool_.is_evictable(b) ? 1 : 0;
    const int64_t needed = std::max<int64_t>(0, ceil_div(total_slots, block_size_) - (int64_t)matched.size());
    return needed <= pool_.num_available() - evictable_matched;
}

int64_t KVCacheManager::add_sequence(int64_t seq_id, const int32_t* tokens, int64_t n, uint64_t extra_key,
                                     bool reuse_prefix) {
    Lock lock(mu_);
    if (seqs_.count(seq_id)) throw SequenceError("sequence id " + std::to_string(seq_id) + " is already added");
    if (n < 0) throw SequenceError("negative token count for sequence " + std::to_string(seq_id));
    Sequence s;
    s.tokens.assign(tokens, tokens + n);
    s.extra_key = extra_key;
    const int64_t cached = reuse_prefix ? match_locked(tokens, n, extra_key, &s.blocks, &s.chain_key) : 0;
    for (int32_t b : s.blocks) pool_.incref(b);
    s.num_slots = cached;
    s.registered = static_cast<int64_t>(s.blocks.size());
    if (enable_prefix_cache_) {
        query_tokens_ += n;
        hit_tokens_ += cached;
    }
    seqs_.emplace(seq_id, std::move(s));
    return cached;
}

void KVCacheManager::extend_tokens(int64_t seq_id, const int32_t* tokens, int64_t n) {
    Lock lock(mu_);
    auto& s = get(seq_id);
    s.tokens.insert(s.tokens.end(), tokens, tokens + n);
}

int32_t KVCacheManager::needed_locked(const Sequence& s, int64_t n) const {
    if (n <= 0) return 0;
    int64_t needed = ceil_div(s.num_slots + n, block_size_) - static_cast<int64_t>(s.blocks.size());
    if (needed < 0) needed = 0;
    // Writing into a partial last block that another sequence shares needs a private copy first.
    if (s.num_slots % block_size_ != 0 && pool_.ref_count(s.blocks.back()) > 1) ++needed;
    return static_cast<int32_t>(needed);
}

void KVCacheManager::append_locked(Sequence& s, int64_t n, int32_t* slots_out, std::vector<BlockCopy>* copies) {
    if (n <= 0) return;
    if (s.num_slots % block_size_ != 0 && pool_.ref_count(s.blocks.back()) > 1) {
        const int32_t shared = s.blocks.back();
        const int32_t mine = pool_.allocate();
        copies->push_back({shared, mine});
        pool_.decref(shared);
        s.blocks.back() = mine;
    }
    while (static_cast<int64_t>(s.blocks.size()) * block_size_ < s.num_slots + n) s.blocks.push_back(pool_.allocate());
    for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = s.num_slots + i;
        slots_out[i] = s.blocks[pos / block_size_] * block_size_ + static_cast<int32_t>(pos % block_size_);
    }
    s.num_slots += n;
    register_full_blocks(s);
}

void KVCacheManager::register_full_blocks(Sequence& s) {
    const int64_t full = std::min(s.num_slots, s.committed) / block_size_;
    for (; s.registered < full; ++s.registered) {
        if (!enable_prefix_cache_) continue;
        const int32_t block = s.blocks[s.registered];
        auto hit = cache_.insert(block, s.chain_key, &s.tokens[s.registered * block_size_], s.extra_key);
        if (hit.block == block) pool_.set_cached(block, true);
        s.chain_key = hit.key;  // an identical entry elsewhere: chain through it, keep ours private
    }
}

std::vector<BlockCopy> KVCacheManager::append_slots(int64_t seq_id, int64_t n, int32_t* slots_out) {
    Lock lock(mu_);
    auto& s = get(seq_id);
    if (n < 0) throw SequenceError("negative slot count for sequence " + std::to_string(seq_id));
    if (s.num_slots + n > static_cast<int64_t>(s.tokens.size())) {
        throw SequenceError("sequence " + std::to_string(seq_id) + " has " + std::to_string(s.tokens.size()) +
                            " known tokens; cannot give slots up to " + std::to_string(s.num_slots + n));
    }
    const int32_t needed = needed_locked(s, n);
    if (needed > pool_.num_available()) {
        throw OutOfBlocksError("sequence " + std::to_string(seq_id) + " needs " + std::to_string(needed) +
                               " blocks, " + std::to_string(pool_.num_available()) + " available");
    }
    std::vector<BlockCopy> copies;
    append_locked(s, n, slots_out, &copies);
    return copies;
}

std::vector<BlockCopy> KVCacheManager::append_decode(const int64_t* seq_ids, int64_t batch, const int32_t* token_ids,
                                                     int32_t* slots_out) {
    Lock lock(mu_);
    std::vector<Sequence*> seqs(batch);
    int64_t needed = 0;
    for (int64_t i = 0; i < batch; ++i) {
        seqs[i] = &get(seq_ids[i]);
        if (seqs[i]->num_slots != static_cast<int64_t>(seqs[i]->tokens.size())) {
            throw SequenceError("sequence " + std::to_string(seq_ids[i]) + " still has tokens without slots; " +
                                "finish its prefill before decoding");
        }
        // One new token: a new block at a block boundary, or a copy of a shared partial block.
        needed += (seqs[i]->num_slots % block_size_ == 0) ? 1
                  : (pool_.ref_count(seqs[i]->blocks.back()) > 1 ? 1 : 0);
    }
    if (needed > pool_.num_available()) {
        throw OutOfBlocksError("decode step needs " + std::to_string(needed) + " blocks, " +
                               std::to_string(pool_.num_available()) + " available");
    }
    std::vector<BlockCopy> copies;
    for (int64_t i = 0; i < batch; ++i) {
        seqs[i]->tokens.push_back(token_ids[i]);
        append_locked(*seqs[i], 1, slots_out + i, &copies);
    }
    return copies;
}

std::vector<BlockCopy> KVCacheManager::append_speculative(int64_t seq_id, int32_t token, const int32_t* drafts,
                                                          int64_t num_drafts, int32_t* slots_out) {
    Lock lock(mu_);
    auto& s = get(seq_id);
    if (num_drafts < 0) throw SequenceError("negative draft count for sequence " + std::to_string(seq_id));
    if (s.num_slots != static_cast<int64_t>(s.tokens.size())) {
        throw SequenceError("sequence " + std::to_string(seq_id) + " still has tokens without slots; " +
                            "finish its prefill before speculating");
    }
    const int32_t needed = needed_locked(s, 1 + num_drafts);
    if (needed > pool_.num_available()) {
        throw OutOfBlocksError("sequence " + std::to_string(seq_id) + " needs " + std::to_string(needed) +
                               " blocks for " + std::to_string(num_drafts) + " drafts, " +
                               std::to_string(pool_.num_available()) + " available");
    }
    s.tokens.push_back(token);
    s.committed = static_cast<int64_t>(s.tokens.size());
    s.tokens.insert(s.tokens.end(), drafts, drafts + num_drafts);
    std::vector<BlockCopy> copies;
    append_locked(s, 1 + num_drafts, slots_out, &copies);
    return copies;
}

void KVCacheManager::truncate(int64_t seq_id, int64_t n) {
    Lock lock(mu_);
    auto& s = get(seq_id);
    const int64_t cached = enable_prefix_cache_ ? s.registered * block_size_ : 0;
    if (n < cached || n > static_cast<int64_t>(s.tokens.size())) {
        throw SequenceError("sequence " + std::to_string(seq_id) + ": cannot keep " + std::to_string(n) + " of " +
                            std::to_string(s.tokens.size()) + " tokens (" + std::to_string(cached) +
                            " are in cached blocks)");
    }
    s.tokens.resize(n);
    s.num_slots = std::min(s.num_slots, n);
    s.registered = std::min(s.registered, s.num_slots / block_size_);  // without a cache, blocks were only counted
    const size_t keep = static_cast<size_t>((s.num_slots + block_size_ - 1) / block_size_);
    while (s.blocks.size() > keep) {  // tail first, as free() releases them
        pool_.decref(s.blocks.back());
        s.blocks.pop_back();
    }
    s.committed = INT64_MAX;
    register_full_blocks(s);
}

bool KVCacheManager::can_append(int64_t seq_id, int64_t n) const {
    Lock lock(mu_);
    return needed_locked(get(seq_id), n) <= pool_.num_available();
}

int32_t KVCacheManager::blocks_needed(int64_t seq_id, int64_t n) const {
    Lock lock(mu_);
    return needed_locked(get(seq_id), n);
}

void KVCacheManager::fork(int64_t parent_id, int64_t child_id) {
    Lock lock(mu_);
    const auto& parent = get(parent_id);
    if (seqs_.count(child_id)) throw SequenceError("sequence id " + std::to_string(child_id) + " is already added");
    Sequence child = parent;
    for (int32_t b : child.blocks) pool_.incref(b);
    seqs_.emplace(child_id, std::move(child));
}

void KVCacheManager::free(int64_t seq_id) {
    Lock lock(mu_);
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) {
        throw SequenceError("free of unknown sequence id " + std::to_string(seq_id) + " (never added, or freed twice)");
    }
    // Tail first: the tail of a prefix is released earliest, so it is evicted before the blocks it extends.
    const auto& blocks = it->second.blocks;
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool_.decref(*b);
    seqs_.erase(it);
}

bool KVCacheManager::has_sequence(int64_t seq_id) const {
    Lock lock(mu_);
    return seqs_.count(seq_id) > 0;
}

int64_t KVCacheManager::num_slots(int64_t seq_id) const {
    Lock lock(mu_);
    return get(seq_id).num_slots;
}

int64_t KVCacheManager::num_tokens(int64_t seq_id) const {
    Lock lock(mu_);
    return static_cast<int64_t>(get(seq_id).tokens.size());
}

std::vector<int32_t> KVCacheManager::block_table(int64_t seq_id) const {
    Lock lock(mu_);
    return get(seq_id).blocks;
}

void KVCacheManager::fill_block_tables(const int64_t* seq_ids, int64_t batch, int32_t* out, int64_t stride) const {
    Lock lock(mu_);
    for (int64_t i = 0; i < batch; ++i) {
        const auto& blocks = get(seq_ids[i]).blocks;
        const int64_t len = static_cast<int64_t>(blocks.size());
        if (len > stride) {
            throw SequenceError("block table of sequence " + std::to_string(seq_ids[i]) + " has " +
                                std::to_string(len) + " blocks, more than the row width " + std::to_string(stride));
        }
        int32_t* row = out + i * stride;
        std::copy(blocks.begin(), blocks.end(), row);
        std::fill(row + len, row + stride, BlockPool::kPaddingBlock);
    }
}

CacheStats KVCacheManager::stats() const {
    Lock lock(mu_);
    return CacheStats{pool_.num_usable(), pool_.num_free(), pool_.num_used(), pool_.num_evictable(), cache_.size(),
                      static_cast<int32_t>(seqs_.size()), query_tokens_, hit_tokens_};
}

int32_t KVCacheManager::num_available_blocks() const {
    Lock lock(mu_);
    return pool_.num_available();
}

int32_t KVCacheManager::ref_count(int32_t block) const {
    Lock lock(mu_);
    return pool_.ref_count(block);
}

bool KVCacheManager::is_cached(int32_t block) const {
    Lock lock(mu_);
    return cache_.contains(block);
}

}  // namespace rtp_llm
