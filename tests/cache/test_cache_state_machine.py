"""Random allocate / append / decode / fork / free / evict sequences against the C++ KVCacheManager.

A model KV store records, for every slot written, a fingerprint of the whole token prefix that the
KV at that slot was computed from. After every step, every live sequence must still read its own
prefix at every position (nobody overwrote it, copy-on-write worked, a prefix hit returned the right
blocks, even with a 1-bit bucket hash that makes every lookup collide), and the block accounting
must add up.
"""

from collections import Counter

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rtp_llm.cache import KVCacheManager, OutOfBlocksError, SequenceError

TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=14)  # tiny vocab: prefixes collide often


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(2, 14),
        block_size=st.integers(1, 4),
        prefix_cache=st.booleans(),
        hash_bits=st.sampled_from([1, 64]),
    )
    def setup(self, num_blocks, block_size, prefix_cache, hash_bits):
        self.m = KVCacheManager(num_blocks, block_size, prefix_cache, hash_bits)
        self.bs = block_size
        self.tokens = {}  # seq id -> known tokens
        self.kv = {}  # slot -> prefix fingerprint (tuple of tokens)
        self.next_id = 0

    # --- helpers -------------------------------------------------------------------------------
    def _slot(self, seq, pos):
        table = self.m.block_table(seq)
        return table[pos // self.bs] * self.bs + pos % self.bs

    def _write(self, seq, first_pos, slots):
        toks = self.tokens[seq]
        for i, slot in enumerate(slots.tolist()):
            pos = first_pos + i
            assert self.m.ref_count(slot // self.bs) == 1, "a write landed in a shared block"
            self.kv[slot] = tuple(toks[: pos + 1])

    def _apply_copies(self, copies):
        for src, dst in copies:
            for off in range(self.bs):
                if src * self.bs + off in self.kv:
                    self.kv[dst * self.bs + off] = self.kv[src * self.bs + off]

    def _snapshot(self):
        s = self.m.stats()
        return (s.free_blocks, s.used_blocks, s.cached_blocks,
                {q: (self.m.num_slots(q), self.m.num_tokens(q), tuple(self.m.block_table(q))) for q in self.tokens})

    # --- rules ---------------------------------------------------------------------------------
    @rule(prompt=TOKENS, chunk=st.integers(1, 14))
    def add(self, prompt, chunk):
        seq = self.next_id
        self.next_id += 1
        fits = self.m.can_allocate(prompt, len(prompt))
        cached = self.m.add_sequence(seq, prompt)
        self.tokens[seq] = list(prompt)
        assert cached % self.bs == 0 and cached < len(prompt)
        for pos in range(cached):  # the reused prefix really holds this prompt's KV
            assert self.kv[self._slot(seq, pos)] == tuple(prompt[: pos + 1])
        n = min(chunk, len(prompt) - cached)
        if not self._append(seq, n) and n == len(prompt) - cached:
            assert not fits  # can_allocate said no for exactly this

    def _append(self, seq, n) -> bool:
        """Slots for the next n known tokens; on shortage nothing may have changed."""
        first = self.m.num_slots(seq)
        before = self._snapshot()
        slots = np.empty(n, np.int32)
        try:
            copies = self.m.append_slots(seq, slots)
        except OutOfBlocksError:
            assert self._snapshot() == before
            return False
        self._apply_copies(copies)
        self._write(seq, first, slots)
        return True

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 6))
    def prefill_more(self, data, n):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self._append(seq, min(n, len(self.tokens[seq]) - self.m.num_slots(seq)))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def decode(self, data):
        ready = [q for q in sorted(self.tokens) if self.m.num_slots(q) == len(self.tokens[q])]
        if not ready:
            return
        seqs = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True))
        toks = data.draw(st.lists(st.integers(0, 2), min_size=len(seqs), max_size=len(seqs)))
        before = self._snapshot()
        slots = np.empty(len(seqs), np.int32)
        try:
            copies = self.m.append_decode(np.array(seqs, np.int64), np.array(toks, np.int32), slots)
        except OutOfBlocksError:
            assert self._snapshot() == before
            return
        self._apply_copies(copies)
        for seq, tok, slot in zip(seqs, toks, slots.tolist()):
            self.tokens[seq].append(tok)
            self._write(seq, len(self.tokens[seq]) - 1, np.array([slot]))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = self.next_id
        self.next_id += 1
        self.m.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        assert self.m.block_table(child) == self.m.block_table(parent)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.free(seq)
        del self.tokens[seq]
        assert not self.m.has_sequence(seq)

    @rule()
    def free_unknown(self):
        try:
            self.m.free(10**9)
        except SequenceError:
            return
        raise AssertionError("freeing an unknown id did not raise")

    # --- invariants ----------------------------------------------------------------------------
    @invariant()
    def accounting_adds_up(self):
        s = self.m.stats()
        assert s.free_blocks + s.used_blocks + s.cached_blocks == s.total_blocks
        assert s.num_sequences == len(self.tokens)

    @invariant()
    def ref_counts_equal_owners(self):
        owners = Counter()
        for q in self.tokens:
            table = self.m.block_table(q)
            assert len(table) == len(set(table)), "a block appears twice in one table"
            assert 0 not in table
            owners.update(table)
        for block, count in owners.items():
            assert self.m.ref_count(block) == count
        assert self.m.stats().used_blocks == len(owners)

    @invariant()
    def every_live_sequence_reads_its_own_prefix(self):
        for q, toks in self.tokens.items():
            for pos in range(self.m.num_slots(q)):
                assert self.kv[self._slot(q, pos)] == tuple(toks[: pos + 1]), (q, pos)

    def teardown(self):
        for q in list(self.tokens):
            self.m.free(q)
        s = self.m.stats()
        assert s.used_blocks == 0 and s.free_blocks + s.cached_blocks == s.total_blocks


CacheMachine.TestCase.settings = CacheMachine.TestCase.settings  # profile from tests/conftest.py
TestCacheMachine = CacheMachine.TestCase
