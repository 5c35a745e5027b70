"""The scheduler: one mixed batch per step under max_num_seqs and max_num_batched_tokens.

Order of work in a step:
  1. running decodes (one token each), in admission order;
  2. running prefills that are part-way through (chunked prefill), in admission order;
  3. waiting sequences, FIFO (preempted ones first), while the budgets and the KV pool allow.
A prefill never takes more than `prefill_chunk` tokens per step, so a long prompt does not stall
running decodes. Blocks are taken from the C++ KVCacheManager as work is scheduled; when they run
out, the most recently admitted running sequence is preempted (its blocks freed, itself requeued
at the front for recompute). Requests are never lost: a preempted sequence keeps its output and
resumes with it.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rtp_llm.cache import KVCacheManager, OutOfBlocksError
from rtp_llm.engine.sequence import Sequence, SeqState

log = logging.getLogger(__name__)


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int              # first position computed this step
    tokens: list[int]       # the tokens computed this step
    slots: np.ndarray       # their KV slots
    samples: bool           # the chunk reaches the end: sample the next token from its last row


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write block copies
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.scheduled)


class Scheduler:
    def __init__(self, manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int, prefill_chunk: int):
        self.manager = manager
        self.max_num_seqs = max_num_seqs
        self.max_tokens = max_num_batched_tokens
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []   # admission order, oldest first
        self._admissions = itertools.count()
        self.num_preemptions = 0

    # --- queue management ----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.state = SeqState.WAITING
        self.waiting.append(seq)

    def start_running(self, seq: Sequence) -> None:
        """A forked sibling joins the running set (its blocks were forked from its parent)."""
        seq.state = SeqState.RUNNING
        seq.admitted_at = next(self._admissions)
        self.running.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Takes a finished or aborted sequence out and frees its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)

    def _free(self, seq: Sequence) -> None:
        if seq.in_manager:
            self.manager.free(seq.seq_id)
            seq.in_manager = False
        seq.num_computed = 0

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.state = SeqState.WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.waiting.appendleft(seq)
        log.info("preempted sequence %d of request %s (recompute %d tokens)", seq.seq_id, seq.request.request_id,
                 seq.num_tokens)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step ------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_tokens
        m = self.manager

        # 1. Running decodes: one batched slot allocation, preempting the newest until it fits.
        while True:
            decodes = [s for s in self.running if s.is_decode]
            decodes = decodes[:budget]
            if not decodes:
                break
            ids = np.fromiter((s.seq_id for s in decodes), dtype=np.int64, count=len(decodes))
            toks = np.fromiter((s.output[-1] for s in decodes), dtype=np.int32, count=len(decodes))
            slots = np.empty(len(decodes), dtype=np.int32)
            try:
                out.copies.extend(m.append_decode(ids, toks, slots))
            except OutOfBlocksError:
                victim = self.running[-1]
                self._preempt(victim, out)
                continue
            for j, s in enumerate(decodes):
                out.scheduled.append(ScheduledSeq(s, s.num_computed, [s.output[-1]], slots[j:j + 1], True))
                s.num_computed += 1
                s.known += 1
            budget -= len(decodes)
            break

        # 2. Running prefills part-way through.
        for s in list(self.running):
            if budget <= 0:
                break
            if s.state != SeqState.RUNNING or s.remaining == 0 or s.is_decode:
                continue
            if not self._schedule_chunk(s, budget, out, preempt=True):
                continue
            budget -= len(out.scheduled[-1].tokens)

        # 3. Waiting sequences, FIFO. Nothing preempted this step is readmitted in the same step.
        while self.waiting and budget > 0:
            s = self.waiting[0]
            if s in out.preempted:
                break
            need = 1 + sum(1 for x in s.request.sequences if x.state == SeqState.PENDING_FORK)
            if len(self.running) + need > self.max_num_seqs and self.running:
                break
            tokens = np.asarray(s.all_tokens(), dtype=np.int32)
            cached = m.match_prefix(tokens)
            chunk = min(s.num_tokens - cached, budget, self.prefill_chunk)
            if not m.can_allocate(tokens, cached + chunk):
                break
            self.waiting.popleft()
            s.num_computed = m.add_sequence(s.seq_id, tokens)
            s.known = len(tokens)
            s.in_manager = True
            if s.request.cached_tokens == 0 and s.preemptions == 0:
                s.request.cached_tokens = s.num_computed
            s.state = SeqState.RUNNING
            s.admitted_at = next(self._admissions)
            self.running.append(s)
            if not self._schedule_chunk(s, budget, out, preempt=False):
                break
            budget -= len(out.scheduled[-1].tokens)
        return out

    def _schedule_chunk(self, s: Sequence, budget: int, out: SchedulerOutput, preempt: bool) -> bool:
        """Slots for s's next prefill chunk. On block shortage: preempt newer sequences (running
        prefills) or give up (admission, which then leaves s waiting)."""
        while True:
            chunk = min(s.remaining, budget, self.prefill_chunk)
            slots = np.empty(chunk, dtype=np.int32)
            try:
                out.copies.extend(self.manager.append_slots(s.seq_id, slots))
            except OutOfBlocksError:
                victim = self.running[-1]
                if not preempt or victim is s:
                    self._preempt(s, out) if preempt else self._unadmit(s)
                    return False
                if any(x.seq is victim for x in out.scheduled):  # rare: only on block shortage
                    self._preempt(s, out)  # never undo work already placed in this step's batch
                    return False
                self._preempt(victim, out)
                continue
            start = s.num_computed
            toks = [s.token_at(i) for i in range(start, start + chunk)]
            s.num_computed += chunk
            out.scheduled.append(ScheduledSeq(s, start, toks, slots, s.num_computed == s.num_tokens))
            return True

    def _unadmit(self, s: Sequence) -> None:
        self.running.remove(s)
        self._free(s)
        s.state = SeqState.WAITING
        self.waiting.appendleft(s)
