"""The proposer interface: given sequences about to decode, draft up to k tokens for each.

A proposer sees a sequence's tokens (prompt + output) and, after each step, what was accepted, so one that keeps
state (a draft model's KV cache) can advance or roll it back. EAGLE-3 heads and MTP layers fit the same interface:
they would also read the target's last hidden states, which the model runner would hand to `propose` (`hidden`).
"""

from __future__ import annotations

from typing import Sequence


class Proposer:
    name = "proposer"

    def propose(self, seqs: Sequence, ks: Sequence[int], hidden=None) -> list[list[int]]:
        """Drafts for each sequence: at most ks[i] tokens to follow seqs[i].all_tokens() (may be fewer, or none)."""
        raise NotImplementedError

    def warm(self, seqs: Sequence) -> None:
        """seqs' prompts were computed this step (their first token is about to be sampled): a proposer with a model
        of its own reads them now, in time to the first token, not in their first speculative step."""

    def accepted(self, seq, num_accepted: int) -> None:
        """After verification: seq kept `num_accepted` of its drafts (its tokens now include them and the bonus)."""

    def release(self, seq) -> None:
        """seq finished, was aborted or preempted: drop whatever is kept for it."""

    def close(self) -> None:
        pass
