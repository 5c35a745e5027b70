"""Typed Python face of the C++ KVCacheManager.

The hot-path methods (append_slots, append_decode, fill_block_tables) are the C++ ones unchanged:
they take int32/int64 buffers (numpy arrays, or `.numpy()` views of CPU torch tensors) and write
into them, so a scheduling step does no per-element Python work. The convenience methods below also
accept plain lists.

Thread safety: every call is serialised by a mutex in C++ and is atomic. A call that runs out of
blocks raises OutOfBlocksError and changes nothing, so the scheduler can catch it and preempt.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from rtp_llm._native import _C

OutOfBlocksError = _C.OutOfBlocksError
"""Not enough free or evictable blocks. Subclass of RuntimeError; nothing was changed."""

SequenceError = _C.SequenceError
"""Unknown, duplicate or already freed sequence id, or a call that does not fit its state (ValueError)."""

CacheStats = _C.CacheStats

TokenIds = Union[Sequence[int], np.ndarray]


def as_int32(tokens: TokenIds) -> np.ndarray:
    """Token ids as a contiguous int32 array (no copy when they already are one)."""
    return np.ascontiguousarray(tokens, dtype=np.int32)


class KVCacheManager(_C.KVCacheManager):
    """Per-sequence block tables over a fixed pool of `num_blocks` blocks of `block_size` tokens.

    Block 0 is the padding block and is never handed out. With `enable_prefix_cache`, full blocks
    are cached by their whole prefix and reused by later prompts that start the same way.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True, hash_bits: int = 64):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is padding), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        super().__init__(num_blocks, block_size, enable_prefix_cache, hash_bits)

    def match_prefix(self, tokens: TokenIds, extra_key: int = 0) -> int:
        """Tokens of this prompt already cached (whole blocks, never the last token). Changes nothing."""
        return super().match_prefix(as_int32(tokens), extra_key)

    def can_allocate(self, tokens: TokenIds, total_slots: int, extra_key: int = 0) -> bool:
        """Whether this prompt could be added now with slots for its first `total_slots` tokens."""
        return super().can_allocate(as_int32(tokens), total_slots, extra_key)

    def add_sequence(self, seq_id: int, tokens: TokenIds, extra_key: int = 0, reuse_prefix: bool = True) -> int:
        """Registers a sequence and takes its cached prefix; returns the cached token count. With reuse_prefix
        false nothing is taken (every position is computed), while its full blocks are still cached for others."""
        return super().add_sequence(seq_id, as_int32(tokens), extra_key, reuse_prefix)

    def extend_tokens(self, seq_id: int, tokens: TokenIds) -> None:
        """Adds generated tokens to the sequence (no slots yet)."""
        super().extend_tokens(seq_id, as_int32(tokens))

    def allocate_slots(self, seq_id: int, n: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Convenience form of append_slots: returns (slot mapping, copy-on-write block copies)."""
        slots = np.empty(n, dtype=np.int32)
        copies = self.append_slots(seq_id, slots)
        return slots, copies

    def block_tables(self, seq_ids: Sequence[int], max_blocks: int) -> np.ndarray:
        """Convenience form of fill_block_tables: a new [len(seq_ids), max_blocks] int32 array."""
        out = np.empty((len(seq_ids), max_blocks), dtype=np.int32)
        self.fill_block_tables(np.asarray(seq_ids, dtype=np.int64), out)
        return out
