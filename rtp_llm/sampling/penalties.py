"""The tokens a penalised sequence has seen, kept up to date token by token, and the penalties applied to those
tokens only.

Why: the penalties change only the logits of tokens the sequence has seen, so a step's work is the number of
distinct tokens, not vocab x rows. A sequence's TokenCounts lives as long as it does (the model runner extends it
with each new output token); a step concatenates the counts of its rows, and the sampler gathers, penalises and
scatters back exactly the values the dense [rows, vocab] formulas would give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np
import torch


class _Column:
    """A growable int64 / float32 numpy column (amortised appends, views without copies)."""

    def __init__(self, dtype):
        self.data = np.empty(16, dtype=dtype)
        self.size = 0

    def append(self, value) -> None:
        if self.size == len(self.data):
            self.data = np.concatenate([self.data, np.empty_like(self.data)])
        self.data[self.size] = value
        self.size += 1

    def view(self) -> np.ndarray:
        return self.data[:self.size]

    def copy(self) -> "_Column":
        c = _Column(self.data.dtype)
        c.data, c.size = self.data.copy(), self.size
        return c


class TokenCounts:
    """The distinct ids of prompt and output (the repetition penalty's "seen") and each output id's count (presence
    and frequency penalties) of one sequence."""

    def __init__(self, prompt: Iterable[int], output: Iterable[int] = ()):
        self._seen, self._seen_at = _Column(np.int64), set()
        self._out_ids, self._out_counts, self._out_at = _Column(np.int64), _Column(np.float32), {}
        self.num_output = 0
        for t in prompt:
            self._see(int(t))
        self.extend(output)

    def _see(self, t: int) -> None:
        if t not in self._seen_at:
            self._seen_at.add(t)
            self._seen.append(t)

    def extend(self, tokens: Iterable[int]) -> None:
        """The sequence's next output tokens."""
        for t in tokens:
            t = int(t)
            self._see(t)
            at = self._out_at.get(t)
            if at is None:
                self._out_at[t] = self._out_ids.size
                self._out_ids.append(t)
                self._out_counts.append(1.0)
            else:
                self._out_counts.data[at] += 1.0
            self.num_output += 1

    def follow(self, output: Sequence[int]) -> "TokenCounts":
        """Brought up to `output` (the sequence's whole output so far, which only grows)."""
        self.extend(output[self.num_output:])
        return self

    def plus(self, tokens: Sequence[int]) -> "TokenCounts":
        """A copy with `tokens` appended (a speculating row's drafts), this one unchanged."""
        c = TokenCounts(())
        c._seen, c._seen_at = self._seen.copy(), set(self._seen_at)
        c._out_ids, c._out_counts, c._out_at = self._out_ids.copy(), self._out_counts.copy(), dict(self._out_at)
        c.num_output = self.num_output
        c.extend(tokens)
        return c

    def seen_ids(self) -> np.ndarray:
        return self._seen.view()

    def output_counts(self) -> tuple[np.ndarray, np.ndarray]:
        return self._out_ids.view(), self._out_counts.view()


@dataclass
class PenaltyRows:
    """A step's penalised tokens, flattened over its rows."""
    seen_rows: torch.Tensor   # [S] int64: (row, id) pairs the repetition penalty rescales
    seen_ids: torch.Tensor
    out_rows: torch.Tensor    # [O] int64: (row, id, count) of output tokens, for presence / frequency
    out_ids: torch.Tensor
    out_counts: torch.Tensor  # [O] float32

    @classmethod
    def build(cls, counts: Sequence[Optional[TokenCounts]], device) -> "PenaltyRows":
        seen = [c.seen_ids() if c is not None else np.empty(0, np.int64) for c in counts]
        outs = [c.output_counts() if c is not None else (np.empty(0, np.int64), np.empty(0, np.float32))
                for c in counts]

        def rows(parts):
            return torch.repeat_interleave(torch.arange(len(parts)), torch.tensor([len(p) for p in parts]))

        return cls(rows(seen).to(device), torch.from_numpy(np.concatenate(seen)).to(device),
                   rows([o[0] for o in outs]).to(device), torch.from_numpy(np.concatenate([o[0] for o in outs])).to(device),
                   torch.from_numpy(np.concatenate([o[1] for o in outs])).to(device))


def apply_penalties(logits: torch.Tensor, pen: PenaltyRows, repetition: Optional[torch.Tensor],
                    presence: Optional[torch.Tensor], frequency: Optional[torch.Tensor]) -> torch.Tensor:
    """Hugging Face's repetition penalty (divide positive logits, multiply negative ones, once per seen token), then
    OpenAI's presence and frequency penalties (logit - count * frequency - presence), on a copy; each penalised
    value is computed with the same float operations as the dense [rows, vocab] form."""
    if repetition is None and presence is None:
        return logits
    logits = logits.clone()
    if repetition is not None and pen.seen_ids.numel():
        x = logits[pen.seen_rows, pen.seen_ids]
        rep = repetition[pen.seen_rows]
        logits[pen.seen_rows, pen.seen_ids] = torch.where(x < 0, x * rep, x / rep)
    if presence is not None and pen.out_ids.numel():
        x = logits[pen.out_rows, pen.out_ids]
        counts = pen.out_counts
        logits[pen.out_rows, pen.out_ids] = (x - frequency[pen.out_rows] * counts
                                             - presence[pen.out_rows] * (counts > 0).float())
    return logits
