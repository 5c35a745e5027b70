"""The speculator: which sequences draft this step, how many tokens, and what verification taught.

Per step, before scheduling, every running sequence about to decode may draft up to k tokens:
- No sequence drafts in a step with more than `max_batch` of them decoding: from there a CPU step is compute-bound
  and the extra rows cost time (benchmarks/spec_decode.py --batch-rule).
- How many: a sequence's drafts are taken as accepted one after another with probability a (its acceptance, an
  average over its recent verifications), so k drafts yield (1 - a^(k+1)) / (1 - a) tokens for a step that costs
  t(b + k) / t(b) times a plain one, t(r) being the engine's own decode steps of r rows, timed as they run (b: the
  step's plain rows), plus the proposer's own time for k positions. The speculator drafts the k (at most
  num_speculative_tokens) that maximises tokens per cost, and none when no k beats plain decoding; such a sequence
  probes with one draft every 8 steps so that its estimate can recover.
- A sequence whose drafts were all rejected m times in a row skips 2^m - 1 steps (at most 15).
- k is capped so that the accepted run plus the bonus token fits max_tokens and max_model_len; a constrained sequence
  drafts only the prefix its grammar accepts, up to its first stop token.

Verification itself is the engine's (engine/core.py): each drafted row samples exactly as plain decoding would at
that position, and a draft is kept while it equals that sample, so the output is the same bits as without
speculation, for greedy and seeded sampling alike.
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Sequence

from rtp_llm.config.speculative_config import SpeculativeConfig
from rtp_llm.spec_decode.proposer import Proposer

log = logging.getLogger(__name__)

# Running decodes above which a step does not speculate, unless speculative_config.disable_by_batch_size says.
DEFAULT_MAX_BATCH = 4
_MAX_BACKOFF = 15
_PROBE_EVERY = 8
_DECAY = 0.8           # of a sequence's acceptance record per verification
_PRIOR = (1.5, 0.5)    # a new sequence's record: accepted, rejected (acceptance 0.75)
_COST_PRIOR = 0.15     # an extra row's cost relative to a one-row step, until steps of that size were timed


class StepCost:
    """The engine's own decode-only steps, timed: an average duration per row count (the CPU kernels' cost is not
    linear in rows: a few more rows can be free or cost a third more), so that k drafts beside b plain rows cost
    t(b + k) / t(b) of a plain step, plus the proposer's time for k positions (a draft model's k forwards). A row
    count not timed yet is scaled from the nearest one timed at _COST_PRIOR per row (before any: 1 + _COST_PRIOR
    per extra row)."""

    def __init__(self, decay: float = 0.8):
        self.decay = decay
        self.seconds: dict[int, float] = {}
        self.draft_per_token: Optional[float] = None  # the proposer's time per drafted position

    def observe(self, rows: int, seconds: float) -> None:
        old = self.seconds.get(rows)
        self.seconds[rows] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def observe_drafting(self, positions: int, seconds: float) -> None:
        per = seconds / max(positions, 1)
        old = self.draft_per_token
        self.draft_per_token = per if old is None else self.decay * old + (1 - self.decay) * per

    def relative(self, base: int, extra: int) -> float:
        """A step with `extra` drafted rows beside `base` plain ones, drafting included, in plain steps."""
        if not self.seconds:
            return 1 + _COST_PRIOR * extra
        t0, t1 = self._time(base), self._time(base + extra)
        return (t1 + extra * (self.draft_per_token or 0.0)) / t0

    def _time(self, rows: int) -> float:
        """A step of `rows` rows: timed, or from the nearest timed count at _COST_PRIOR per row of difference."""
        if rows in self.seconds:
            return self.seconds[rows]
        near = min(self.seconds, key=lambda r: abs(r - rows))
        return self.seconds[near] * (1 + _COST_PRIOR * rows) / (1 + _COST_PRIOR * near)


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int):
        self.config, self.proposer = config, proposer
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.max_batch = config.disable_by_batch_size or DEFAULT_MAX_BATCH
        # vLLM's spec-decode counters: steps with drafts, drafted and accepted tokens, accepted per draft position.
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k
        self.cost = StepCost()

    def best_k(self, seq, k_max: int, base: int = 1) -> int:
        """The draft count with the most expected tokens per unit of step cost (beside `base` plain rows); 0 when
        none beats plain decoding."""
        acc, rej = seq.spec_record or _PRIOR
        a = acc / (acc + rej)
        best, best_gain, tokens, p = 0, 1.0, 1.0, 1.0
        for k in range(1, k_max + 1):
            p *= a
            tokens += p
            gain = tokens / self.cost.relative(base, k)
            if gain > best_gain:
                best, best_gain = k, gain
        return best

    def propose(self, decoding: Sequence) -> None:
        """Sets seq.draft for every sequence about to decode ([] where it does not speculate)."""
        if len(decoding) > self.max_batch:
            for s in decoding:
                s.draft = []
            return
        want, ks = [], []
        for s in decoding:
            s.draft = []
            if s.spec_skip > 0:
                s.spec_skip -= 1
                continue
            if s.grammar is not None and not s.grammar.active:
                continue  # the constraint starts after a trigger: drafts would need it mid-run
            k = min(self.k, s.request.params.max_tokens - len(s.output) - 1, self.max_model_len - s.num_tokens)
            if k > 0:
                k = self.best_k(s, k, len(decoding))
                if k == 0:  # speculation does not pay at its acceptance: one draft now and then to find out
                    s.spec_skip = _PROBE_EVERY - 1
                    k = 1
            if k > 0:
                want.append(s)
                ks.append(k)
        if not want:
            return
        t0 = time.perf_counter()
        drafts = self.proposer.propose(want, ks)
        self.cost.observe_drafting(max(ks), time.perf_counter() - t0)
        for s, d in zip(want, drafts):
            if d and s.grammar is not None:
                # The prefix the grammar accepts, up to a stop token: a matcher that consumed one is stopped, and the
                # row after it would never be used.
                d = d[:s.grammar.matcher.validate_tokens(d)]
                d = d[:next((i for i, t in enumerate(d) if t in s.request.min_tokens_ids), len(d))]
            s.draft = list(d)

    def verified(self, seq, num_drafts: int, num_accepted: int) -> None:
        """After a step that verified seq's num_drafts drafts, num_accepted of them kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for p in range(num_accepted):
            self.accepted_per_pos[p] += 1
        acc, rej = seq.spec_record or _PRIOR
        seq.spec_record = (_DECAY * acc + num_accepted, _DECAY * rej + (num_accepted < num_drafts))
        if num_accepted == 0:
            seq.spec_misses += 1
            seq.spec_skip = min(2 ** seq.spec_misses - 1, _MAX_BACKOFF)
        else:
            seq.spec_misses = 0
        self.proposer.accepted(seq, num_accepted)

    def observe_step(self, sched, seconds: float) -> None:
        """A step's duration, for the cost of a row: decode-only steps small enough to speculate."""
        items = sched.scheduled  # (before the step's tokens are appended: a decode starts at its last token)
        if items and len(items) <= self.max_batch and all(x.start == x.seq.num_tokens - 1 for x in items):
            self.cost.observe(sum(len(x.tokens) for x in items), seconds)

    def warm(self, started: Sequence, running: int) -> None:
        """Sequences that sampled their first token this step, while few enough run to speculate."""
        if started and running <= self.max_batch:
            self.proposer.warm(started)

    def release(self, seq) -> None:
        seq.draft = []
        self.proposer.release(seq)

    def close(self) -> None:
        self.proposer.close()

    def stats(self) -> dict:
        return {"spec_decode_num_drafts": self.num_drafts, "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos)}
