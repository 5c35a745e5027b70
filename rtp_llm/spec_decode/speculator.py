"""The speculator: which sequences draft this step, how many tokens, and what verification taught.

Per step, before scheduling: every running sequence about to decode may draft up to k tokens, where k is
num_speculative_tokens bounded so that the accepted run plus the bonus token fits max_tokens and max_model_len.
No sequence drafts in a step with more than `max_batch` of them decoding (there the step is compute-bound: more
rows cost time, while at small batches they ride on the same weight pass). A sequence whose drafts are all rejected
backs off: after m misses in a row it skips 2^m - 1 steps (at most 15) before drafting again. A grammar-constrained
sequence drafts only the prefix of tokens its grammar accepts, up to its first stop token.

Verification itself is the engine's (engine/core.py): each drafted row samples exactly as plain decoding would at
that position, and a draft is kept while it equals that sample, so the output is the same bits as without
speculation, for greedy and seeded sampling alike.
"""

from __future__ import annotations

import logging
from typing import Sequence

from rtp_llm.config.speculative_config import SpeculativeConfig
from rtp_llm.spec_decode.proposer import Proposer

log = logging.getLogger(__name__)

# Running decodes above which a step does not speculate, unless speculative_config.disable_by_batch_size says.
DEFAULT_MAX_BATCH = 4
_MAX_BACKOFF = 15


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int):
        self.config, self.proposer = config, proposer
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.max_batch = config.disable_by_batch_size or DEFAULT_MAX_BATCH
        # vLLM's spec-decode counters: steps with drafts, drafted and accepted tokens, accepted per draft position.
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k

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
                want.append(s)
                ks.append(k)
        if not want:
            return
        for s, d in zip(want, self.proposer.propose(want, ks)):
            if d and s.grammar is not None:
                # The prefix the grammar accepts, and no stop token: a matcher cannot roll back past one (the
                # grammar's walk along the drafts must come back).
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
        if num_accepted == 0:
            seq.spec_misses += 1
            seq.spec_skip = min(2 ** seq.spec_misses - 1, _MAX_BACKOFF)
        else:
            seq.spec_misses = 0
        self.proposer.accepted(seq, num_accepted)

    def release(self, seq) -> None:
        seq.draft = []
        self.proposer.release(seq)

    def close(self) -> None:
        self.proposer.close()

    def stats(self) -> dict:
        return {"spec_decode_num_drafts": self.num_drafts, "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos)}
