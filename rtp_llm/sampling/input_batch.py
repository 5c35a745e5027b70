"""InputBatch: the sampled rows' parameters kept across steps (vLLM's persistent input batch, on the host).

A sequence's parameters (temperature, top-k/p, min-p, penalties, seed, logprobs, token masks, bias) are written
into a slot of [capacity] columns once, when it first samples, and its slot is freed when the scheduler reports it
finished. A step's SamplingBatch is then one gather of each column by its rows' slots; only what moves every step
(the step counter, the penalties' seen tokens, bad words' next tokens) is built per step. It equals
SamplingBatch.build on the same rows (tests/sampling/test_input_batch.py).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Optional, Sequence

import numpy as np
import torch

from rtp_llm.sampling.params import SamplingParams
from rtp_llm.sampling.penalties import PenaltyRows, TokenCounts
from rtp_llm.sampling.sampler import SamplingBatch, bad_word_ends

# Per-slot flags: which optional columns a row needs (OR-reduced over a step's rows).
_K, _P, _MIN_P, _REP, _PF, _GREEDY, _ALLOWED, _BIAS, _BAD = (1 << i for i in range(9))
_NO_LOGPROBS = -2  # below every valid `logprobs` (-1 = the whole vocabulary)

_COLUMNS = {"temperature": np.float32, "greedy": np.bool_, "top_k": np.int64, "top_p": np.float32,
            "min_p": np.float32, "repetition": np.float32, "presence": np.float32, "frequency": np.float32,
            "seeds": np.int64, "logprobs": np.int64, "flags": np.int32}


class InputBatch:
    def __init__(self, vocab_size: int, device="cpu", capacity: int = 64):
        self.vocab_size, self.device = vocab_size, device
        self.slots: dict[Hashable, int] = {}
        self.free: list[int] = []
        self.cols = {name: np.zeros(capacity, dtype) for name, dtype in _COLUMNS.items()}
        self.params: list[Optional[SamplingParams]] = [None] * capacity
        self.allowed: list[Optional[torch.Tensor]] = [None] * capacity  # [V] bool where allowed_token_ids is set
        self.bias: list[Optional[tuple[torch.Tensor, torch.Tensor]]] = [None] * capacity  # (ids, values)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.slots

    def __len__(self) -> int:
        return len(self.slots)

    def add(self, key: Hashable, params: SamplingParams, seed: int) -> None:
        """Writes a row's parameters into a free slot (the columns double when full)."""
        if not self.free:
            n = len(self.params)
            self.cols = {k: np.concatenate([c, np.zeros_like(c)]) for k, c in self.cols.items()}
            for lst in (self.params, self.allowed, self.bias):
                lst.extend([None] * n)
            self.free = list(range(2 * n - 1, n - 1, -1))
        slot = self.slots[key] = self.free.pop()
        greedy, vocab, c = params.temperature == 0, self.vocab_size, self.cols
        uses_k = 0 < params.top_k < vocab
        c["temperature"][slot] = 1.0 if greedy else params.temperature
        c["greedy"][slot] = greedy
        c["top_k"][slot] = params.top_k if uses_k else vocab
        c["top_p"][slot], c["min_p"][slot] = params.top_p, params.min_p
        c["repetition"][slot] = params.repetition_penalty
        c["presence"][slot], c["frequency"][slot] = params.presence_penalty, params.frequency_penalty
        c["seeds"][slot] = seed
        c["logprobs"][slot] = _NO_LOGPROBS if params.logprobs is None else params.logprobs
        c["flags"][slot] = (
            _K * uses_k | _P * (params.top_p < 1) | _MIN_P * (params.min_p > 0)
            | _REP * (params.repetition_penalty != 1)
            | _PF * (params.presence_penalty != 0 or params.frequency_penalty != 0) | _GREEDY * greedy
            | _ALLOWED * (params.allowed_token_ids is not None) | _BIAS * bool(params.logit_bias)
            | _BAD * bool(params.bad_words_token_ids))
        self.params[slot] = params
        self.allowed[slot] = None
        if params.allowed_token_ids is not None:
            row = torch.zeros(vocab, dtype=torch.bool)
            row[torch.tensor(params.allowed_token_ids, dtype=torch.int64)] = True
            self.allowed[slot] = row
        self.bias[slot] = None
        if params.logit_bias:
            items = list(params.logit_bias.items())
            self.bias[slot] = (torch.tensor([int(t) for t, _ in items], dtype=torch.int64),
                               torch.tensor([float(v) for _, v in items], dtype=torch.float32))

    def remove(self, keys: Iterable[Hashable]) -> None:
        """Frees the slots of finished rows (keys never added are ignored)."""
        for key in keys:
            slot = self.slots.pop(key, None)
            if slot is not None:
                self.params[slot] = self.allowed[slot] = self.bias[slot] = None
                self.free.append(slot)

    def batch(self, keys: Sequence[Hashable], steps: Sequence[int], output_tokens: Sequence[Sequence[int]],
              counts: Sequence[Optional[TokenCounts]]) -> SamplingBatch:
        """The SamplingBatch of these rows (each key added before): steps, output tokens (bad words) and the
        penalised rows' TokenCounts as SamplingBatch.build takes them."""
        idx = np.fromiter((self.slots[k] for k in keys), dtype=np.int64, count=len(keys))
        c, dev = self.cols, self.device

        def col(name):
            return torch.from_numpy(c[name][idx]).to(dev)

        flags = int(np.bitwise_or.reduce(c["flags"][idx])) if len(idx) else 0
        greedy = c["greedy"][idx]
        logprobs = int(c["logprobs"][idx].max()) if len(idx) else _NO_LOGPROBS
        slots = idx.tolist()
        allowed = banned = bias = None
        if flags & _ALLOWED:
            mask = torch.ones(len(slots), self.vocab_size, dtype=torch.bool)
            for i, s in enumerate(slots):
                if self.allowed[s] is not None:
                    mask[i] = self.allowed[s]
            allowed = mask.to(dev)
        if flags & _BAD:
            ban = [(i, t) for i, s in enumerate(slots) if c["flags"][s] & _BAD
                   for t in bad_word_ends(self.params[s].bad_words_token_ids, output_tokens[i])]
            if ban:
                banned = (torch.tensor([r for r, _ in ban], dtype=torch.int64).to(dev),
                          torch.tensor([t for _, t in ban], dtype=torch.int64).to(dev))
        if flags & _BIAS:
            parts = [(i, self.bias[s]) for i, s in enumerate(slots) if self.bias[s] is not None]
            bias = (torch.cat([torch.full((len(b[0]),), i, dtype=torch.int64) for i, b in parts]).to(dev),
                    torch.cat([b[0] for _, b in parts]).to(dev), torch.cat([b[1] for _, b in parts]).to(dev))
        penalised = flags & (_REP | _PF)
        return SamplingBatch(
            temperature=col("temperature"), greedy=torch.from_numpy(greedy).to(dev),
            top_k=col("top_k") if flags & _K else None, top_p=col("top_p") if flags & _P else None,
            min_p=col("min_p") if flags & _MIN_P else None,
            repetition=col("repetition") if flags & _REP else None,
            presence=col("presence") if flags & _PF else None, frequency=col("frequency") if flags & _PF else None,
            penalties=PenaltyRows.build(counts, dev) if penalised else None,
            seeds=col("seeds"), steps=torch.tensor(list(steps), dtype=torch.int64).to(dev),
            all_greedy=bool(greedy.all()), any_greedy=bool(greedy.any()),
            num_logprobs=logprobs if logprobs != _NO_LOGPROBS else -1,
            allowed=allowed, banned=banned, bias=bias)
