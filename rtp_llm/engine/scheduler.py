"""The scheduler: one mixed batch per step under max_num_seqs and max_num_batched_tokens. It owns the KV
block accounting (the C++ KVCacheManager): every block a sequence holds was taken here and is freed here.

Order of work in a step:
  1. running decodes (one token each; a speculating one its last token and its drafts), in admission order;
  2. running prefills that are part-way through (chunked prefill), in admission order;
  3. waiting sequences, FIFO (preempted ones first), while the budgets and the KV pool allow.
A prefill never takes more than `prefill_chunk` tokens per step, so a long prompt does not stall
running decodes. Blocks are taken from the C++ KVCacheManager as work is scheduled; when they run
out, the most recently admitted running sequence is preempted (its blocks freed, itself requeued
at the front for recompute). Requests are never lost: a preempted sequence keeps its output and
resumes with it.

The step's output says what to compute (tokens, positions, KV slots, block tables, copy-on-write copies) and
which sequences sample from which logits row: a request's siblings (n > 1) sample from sequence 0's last prompt
row, and are forked from it in the manager once that step has run (fork_siblings).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rtp_llm.cache import KVCacheManager, OutOfBlocksError
from rtp_llm.device.forward_batch import ForwardBatch
from rtp_llm.engine.sequence import Sequence, SeqState

log = logging.getLogger(__name__)


def _pending_forks(seq: Sequence) -> int:
    return sum(1 for x in seq.request.sequences if x.state == SeqState.PENDING_FORK) if seq.index == 0 else 0


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int              # first position computed this step
    tokens: list[int]       # the tokens computed this step
    slots: np.ndarray       # their KV slots
    needs_sample: bool      # the chunk reaches the end: sample the next token from its last row
    all_rows: bool = False  # every row's logits (prompt logprobs), not only the last
    draft: list[int] = field(default_factory=list)  # speculation: tokens[1:], each of whose rows samples too

    @property
    def need_logits(self) -> int:
        return ForwardBatch.LOGITS_ALL if self.all_rows or self.draft else int(self.needs_sample)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write block copies
    preempted: list[Sequence] = field(default_factory=list)
    block_table: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.int32))  # [B, W] int32
    # (sequence, logits row) for every token to sample (rows: the items' LOGITS_* rows, in order)
    sample_rows: list[tuple[Sequence, int]] = field(default_factory=list)
    # per sample row: how many of its sequence's drafts precede it (0 but for a speculating sequence's later rows)
    sample_ahead: list[int] = field(default_factory=list)
    # (sequence, first position, first logits row, rows) of every item whose rows all have logits
    prompt_rows: list[tuple[Sequence, int, int, int]] = field(default_factory=list)
    # sequences finished since the last step that ran (the runner frees their rows of its persistent input batch)
    finished: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.scheduled)


class Scheduler:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, max_num_seqs: int,
                 max_num_batched_tokens: int, prefill_chunk: int, max_loras: int = 1):
        self.manager = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
        self.max_loras = max_loras  # distinct LoRA adapters among the running sequences
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_tokens = max_num_batched_tokens
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []   # admission order, oldest first
        self._admissions = itertools.count()
        self.num_preemptions = 0
        self._finished: list[Sequence] = []

    # --- queue management ----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.state = SeqState.WAITING
        self.waiting.append(seq)

    def start_running(self, seq: Sequence) -> None:
        """A forked sibling joins the running set (its blocks were forked from its parent)."""
        seq.state = SeqState.RUNNING
        seq.admitted_at = next(self._admissions)
        self.running.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Takes a finished or aborted sequence out and frees its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        seq.draft = []
        seq.state = SeqState.FINISHED
        self._finished.append(seq)

    def fork_siblings(self, out: SchedulerOutput) -> None:
        """After the step ran: each sibling that sampled from sequence 0's last prompt row now shares its blocks
        (copy-on-write of the partial last block when either side appends) and runs on its own."""
        for seq, _ in out.sample_rows:
            if seq.state != SeqState.PENDING_FORK:
                continue
            parent = seq.request.sequences[0]
            self.manager.fork(parent.seq_id, seq.seq_id)
            seq.num_computed_tokens = parent.num_computed_tokens
            self.start_running(seq)

    def _free(self, seq: Sequence) -> None:
        if self.manager.has_sequence(seq.seq_id):
            self.manager.free(seq.seq_id)
        seq.num_computed_tokens = 0

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.state = SeqState.WAITING
        seq.draft = []
        seq.preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.waiting.appendleft(seq)
        log.info("preempted sequence %d of request %s (recompute %d tokens)", seq.seq_id, seq.request.request_id,
                 seq.num_tokens)

    # --- one step ------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_tokens
        m = self.manager

        # 1. Running decodes: one batched slot allocation, preempting the newest until it fits. Sequences with
        # drafts (speculation) come after, each with its own allocation.
        while True:
            decodes = [s for s in self.running if self._is_decode(s) and not s.draft]
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
                out.scheduled.append(ScheduledSeq(s, s.num_computed_tokens, [s.output[-1]], slots[j:j + 1], True))
                s.num_computed_tokens += 1
            budget -= len(decodes)
            break
        for s in [s for s in self.running if s.draft]:
            if budget <= 0:
                break
            if s.state == SeqState.RUNNING and self._is_decode(s) and self._schedule_speculative(s, budget, out):
                budget -= len(out.scheduled[-1].tokens)

        # 2. Running prefills part-way through.
        for s in list(self.running):
            if budget <= 0:
                break
            if s.state != SeqState.RUNNING or s.remaining <= 0 or self._is_decode(s):  # < 0: drafts scheduled
                continue
            if not self._schedule_chunk(s, budget, out, preempt=True):
                continue
            budget -= len(out.scheduled[-1].tokens)

        # 3. Waiting sequences, FIFO. Nothing preempted this step is readmitted in the same step. Siblings waiting
        # for their parent's prefill count as running: they join it without another admission.
        forks = sum(_pending_forks(s) for s in self.running if s.index == 0)
        while self.waiting and budget > 0:
            s = self.waiting[0]
            if s in out.preempted:
                break
            need = 1 + _pending_forks(s)
            if len(self.running) + forks + need > self.max_num_seqs and self.running:
                break
            lora = s.request.lora_id
            if lora:
                running = {x.request.lora_id for x in self.running} - {0}
                if lora not in running and len(running) >= self.max_loras:
                    break  # a step holds at most max_loras adapters: this one waits for a slot
            tokens = np.asarray(s.all_tokens(), dtype=np.int32)
            # a cached position has no logits, nor hidden states to pool
            reuse = not (s.index == 0 and s.request.needs_prompt_logprobs) and s.request.pooling is None
            # the adapter's load keys the prefix cache: one adapter's KV is never another's (or the base's)
            key = s.request.lora_key
            cached = m.match_prefix(tokens, key) if reuse else 0
            chunk = min(s.num_tokens - cached, budget, self.prefill_chunk)
            if not m.can_allocate(tokens if reuse else tokens[:0], cached + chunk, key):
                break
            self.waiting.popleft()
            s.num_computed_tokens = m.add_sequence(s.seq_id, tokens, key, reuse_prefix=reuse)
            if s.request.cached_tokens == 0 and s.preemptions == 0:
                s.request.cached_tokens = s.num_computed_tokens
            s.state = SeqState.RUNNING
            s.admitted_at = next(self._admissions)
            self.running.append(s)
            forks += need - 1
            if not self._schedule_chunk(s, budget, out, preempt=False):
                break
            budget -= len(out.scheduled[-1].tokens)
        self._finish_output(out)
        if out.scheduled:  # a step that runs reports them (the core skips empty ones)
            out.finished, self._finished = self._finished, []
        return out

    def subset(self, out: SchedulerOutput, items: list[ScheduledSeq]) -> SchedulerOutput:
        """The step `out` narrowed to `items` (one request's, to rerun it alone after the whole step failed): their
        slots as allocated, block tables and sample rows rebuilt; copy-on-write copies again (they are idempotent)."""
        sub = SchedulerOutput(scheduled=list(items), copies=list(out.copies))
        self._finish_output(sub)
        return sub

    def _finish_output(self, out: SchedulerOutput) -> None:
        """The step's block tables and sample rows, once every allocation of the step is done."""
        items = out.scheduled
        if not items:
            return
        bs = self.block_size
        width = max((x.start + len(x.tokens) + bs - 1) // bs for x in items)
        out.block_table = np.empty((len(items), width), dtype=np.int32)
        self.manager.fill_block_tables(np.fromiter((x.seq.seq_id for x in items), dtype=np.int64, count=len(items)),
                                       out.block_table)
        row = 0
        for x in items:
            if x.all_rows:
                out.prompt_rows.append((x.seq, x.start, row, len(x.tokens)))
                row += len(x.tokens) - 1  # the last of them samples when the chunk ends the prompt
            if not x.needs_sample:
                row += int(x.all_rows)
                continue
            if x.draft:
                out.sample_rows.extend((x.seq, row + j) for j in range(len(x.tokens)))
                out.sample_ahead.extend(range(len(x.tokens)))
                row += len(x.tokens)
                continue
            out.sample_rows.append((x.seq, row))
            if x.seq.index == 0:
                out.sample_rows.extend((sib, row) for sib in x.seq.request.sequences[1:]
                                       if sib.state == SeqState.PENDING_FORK)
            out.sample_ahead.extend([0] * (len(out.sample_rows) - len(out.sample_ahead)))
            row += 1

    def decoding(self) -> list[Sequence]:
        """The running sequences whose next step is a decode (the ones that may speculate)."""
        return [s for s in self.running if self._is_decode(s)]

    def _schedule_speculative(self, s: Sequence, budget: int, out: SchedulerOutput) -> bool:
        """s's last token and its drafts (as many as the budget and the pool allow; none if need be). On block
        shortage without drafts: preempt the newest sequence not in this step, or s itself."""
        draft = s.draft[:budget - 1]
        while True:
            slots = np.empty(1 + len(draft), dtype=np.int32)
            try:
                out.copies.extend(self.manager.append_speculative(s.seq_id, s.output[-1],
                                                                  np.asarray(draft, dtype=np.int32), slots))
                break
            except OutOfBlocksError:
                if draft:
                    draft = []
                    continue
                victim = self.running[-1]
                if victim is s or any(x.seq is victim for x in out.scheduled):
                    self._preempt(s, out)
                    return False
                self._preempt(victim, out)
        s.draft = draft
        out.scheduled.append(ScheduledSeq(s, s.num_computed_tokens, [s.output[-1]] + draft, slots, True, draft=draft))
        s.num_computed_tokens += 1 + len(draft)
        return True

    def settle_speculation(self, s: Sequence, kept: int) -> None:
        """After verification: s keeps the KV of its first `kept` tokens; the rejected drafts' slots and any
        block only they used go back (never into the prefix cache)."""
        self.manager.truncate(s.seq_id, kept)
        s.num_computed_tokens = kept
        s.draft = []

    def _is_decode(self, s: Sequence) -> bool:
        """One token left, and it is the last sampled one, which the manager has not seen yet (a recompute whose
        prefill chunk stops one short is still a prefill). The manager holds the sequence's token count."""
        return (s.state == SeqState.RUNNING and s.remaining == 1
                and self.manager.num_tokens(s.seq_id) == s.num_computed_tokens)

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
            start = s.num_computed_tokens
            toks = [s.token_at(i) for i in range(start, start + chunk)]
            s.num_computed_tokens += chunk
            req = s.request
            all_rows = ((s.index == 0 and req.needs_prompt_logprobs and start < len(s.prompt) - 1)
                        or req.pool_wanted == "all" or (req.pool_wanted == "first" and start == 0))
            out.scheduled.append(ScheduledSeq(s, start, toks, slots, s.num_computed_tokens == s.num_tokens, all_rows))
            return True

    def _unadmit(self, s: Sequence) -> None:
        self.running.remove(s)
        self._free(s)
        s.state = SeqState.WAITING
        self.waiting.appendleft(s)
