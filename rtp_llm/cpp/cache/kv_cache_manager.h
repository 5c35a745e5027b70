// KVCacheManager: per-sequence block tables over a BlockPool, with prefix reuse through BlockCache.
//
// A sequence's life:  add_sequence(prompt) -> matched prefix (cached tokens, no compute needed)
//                     append_slots(n)       -> slot mapping for the next n known tokens (prefill chunks)
//                     append_decode(...)    -> one token + one slot per running sequence, batched
//                     append_speculative()  -> the last token plus drafts to verify, with slots; their
//                     truncate(n)              blocks reach the prefix cache only once accepted (truncate)
//                     fork(parent, child)   -> n > 1 sampling; the last partial block is copied on write
//                     free()                -> every block released; full ones stay cached (LRU)
//
// Slots are block * block_size + offset. Block tables and slot mappings are written straight into
// caller-owned int32 arrays, so the Python hot path does no per-element work.
//
// Prefix matching never covers a whole prompt: at least its last token is computed, because the
// model needs that token's hidden state to produce logits.
//
// Full blocks are registered in the prefix cache when their slots are handed out, i.e. in the same
// step whose forward writes their KV. Attention backends write a layer's KV for the whole batch
// before they read it, so a sequence admitted in that step may already share those blocks.
//
// Thread safety: every public method takes an internal mutex, so calls from different threads are
// serialised and each call is atomic. Each call that can run out of blocks checks first and throws
// OutOfBlocksError with nothing changed.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "rtp_llm/cpp/cache/block_cache.h"
#include "rtp_llm/cpp/cache/block_pool.h"

namespace rtp_llm {

struct BlockCopy {
    int32_t src;
    int32_t dst;
};

struct CacheStats {
    int32_t total_blocks;      // usable blocks (padding block excluded)
    int32_t free_blocks;       // neither held nor cached
    int32_t used_blocks;       // held by at least one sequence
    int32_t cached_blocks;     // cached and held by no sequence (evictable)
    int32_t cache_entries;     // blocks registered in the prefix cache (held or not)
    int32_t num_sequences;
    int64_t prefix_query_tokens;  // prompt tokens looked up
    int64_t prefix_hit_tokens;    // of which found cached
    double hit_rate() const {
        return prefix_query_tokens ? static_cast<double>(prefix_hit_tokens) / prefix_query_tokens : 0.0;
    }
};

class KVCacheManager {
public:
    KVCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_cache = true, int hash_bits = 64);

    int32_t block_size() const { return block_size_; }
    int32_t num_blocks() const { return pool_.num_blocks(); }
    bool prefix_cache_enabled() const { return enable_prefix_cache_; }

    // Tokens of this prompt already cached (whole blocks, never the whole prompt). Read-only.
    int64_t match_prefix(const int32_t* tokens, int64_t n, uint64_t extra_key = 0) const;

    // Whether add_sequence(tokens) followed by slots up to `total_slots` (cached prefix included) fits now.
    bool can_allocate(const int32_t* tokens, int64_t n, int64_t total_slots, uint64_t extra_key = 0) const;

    // Registers a sequence with its prompt and takes its cached prefix. Returns the cached token count;
    // that many slots are already filled. With reuse_prefix false nothing is taken (every token is computed:
    // a request that needs each prompt position's logits), though its full blocks are still cached for others.
    int64_t add_sequence(int64_t seq_id, const int32_t* tokens, int64_t n, uint64_t extra_key = 0,
                         bool reuse_prefix = true);

    // Adds generated tokens to the sequence's known tokens (no slots yet).
    void extend_tokens(int64_t seq_id, const int32_t* tokens, int64_t n);

    // Slots for the next n known tokens, written to slots_out[0:n]. Returns copy-on-write block copies
    // the caller must perform on the KV buffer before this step's writes.
    std::vector<BlockCopy> append_slots(int64_t seq_id, int64_t n, int32_t* slots_out);

    // For each i: extend seq_ids[i] with token_ids[i] and give it one slot (slots_out[i]).
    std::vector<BlockCopy> append_decode(const int64_t* seq_ids, int64_t batch, const int32_t* token_ids,
                                         int32_t* slots_out);

    // Speculative decoding: extends the sequence with its last sampled token and `num_drafts` drafted tokens after
    // it, each with a slot (slots_out[0 : 1 + num_drafts]). The drafts are tentative: blocks they fill are not
    // offered to the prefix cache until truncate() says how many were accepted. Nothing changes on a throw.
    std::vector<BlockCopy> append_speculative(int64_t seq_id, int32_t token, const int32_t* drafts,
                                              int64_t num_drafts, int32_t* slots_out);

    // Keeps the first n known tokens (and their slots) and drops the rest: blocks no longer needed go back to
    // the pool, and the full blocks of what is kept are offered to the prefix cache. n may not cut into a block
    // already cached (without a prefix cache, any n up to the known tokens).
    void truncate(int64_t seq_id, int64_t n);

    bool can_append(int64_t seq_id, int64_t n) const;
    // Blocks append_slots(seq_id, n) would take from the pool (copy-on-write included).
    int32_t blocks_needed(int64_t seq_id, int64_t n) const;

    // child shares every block of parent (ref counts up); the first append into a shared partial
    // block copies it.
    void fork(int64_t parent_id, int64_t child_id);

    // Releases every block of the sequence. Throws SequenceError for an unknown (or already freed) id.
    void free(int64_t seq_id);

    bool has_sequence(int64_t seq_id) const;
    int64_t num_slots(int64_t seq_id) const;   // tokens whose KV has a slot
    int64_t num_tokens(int64_t seq_id) const;  // tokens known (prompt + generated)
    std::vector<int32_t> block_table(int64_t seq_id) const;

    // Row i of out (row stride `stride` int32s) = block table of seq_ids[i], padded with block 0.
    // Throws when a table is longer than stride.
    void fill_block_tables(const int64_t* seq_ids, int64_t batch, int32_t* out, int64_t stride) const;

    CacheStats stats() const;
    int32_t num_available_blocks() const;  // free + evictable

    // Read-only views for tests: a block's ref count and whether it is registered in the prefix cache.
    int32_t ref_count(int32_t block) const;
    bool is_cached(int32_t block) const;

private:
    struct Sequence {
        std::vector<int32_t> blocks;
        std::vector<int32_t> tokens;
        int64_t num_slots = 0;
        int64_t registered = 0;  // full blocks already offered to the prefix cache
        int64_t committed = INT64_MAX;  // tokens past this are drafts: their blocks are not offered yet
        uint64_t chain_key = BlockCache::kRootKey;
        uint64_t extra_key = 0;
    };

    Sequence& get(int64_t seq_id);
    const Sequence& get(int64_t seq_id) const;
    int64_t match_locked(const int32_t* tokens, int64_t n, uint64_t extra_key, std::vector<int32_t>* blocks,
                         uint64_t* last_key) const;
    int32_t needed_locked(const Sequence& s, int64_t n) const;
    void append_locked(Sequence& s, int64_t n, int32_t* slots_out, std::vector<BlockCopy>* copies);
    void register_full_blocks(Sequence& s);

    int32_t block_size_;
    bool enable_prefix_cache_;
    BlockPool pool_;
    BlockCache cache_;
    absl::flat_hash_map<int64_t, Sequence> seqs_;
    int64_t query_tokens_ = 0;
    int64_t hit_tokens_ = 0;
    mutable std::mutex mu_;
};

}  // namespace rtp_llm
