"""The batched sampler: token masks and logit bias, penalties, temperature, top-k/top-p, min-p, seeded sampling,
logprobs.

All vocab-sized work is one tensor op over the whole [R, V] batch; per-request values arrive as
[R] tensors built once per step (SamplingBatch). Order: allowed_token_ids, bad words (-inf), logit_bias (added),
the grammar mask (-inf; where the masks together leave a row nothing, the grammar's alone), then as Hugging
Face's generate applies them: repetition penalty, presence/frequency penalties, temperature, top-k then top-p (the
documented npu_top_k_top_p algorithm, on the device's op set), min-p, then a draw. Greedy rows take the argmax of the
penalised logits. Draws use the exponential race argmax(p / E) with E = -log(U) and U from the counter-based
generator (device/random.py), which selects token i with probability p_i.

Logprobs are of the model's raw distribution (log_softmax of the unprocessed logits), as vLLM
returns by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from rtp_llm.device.torch_ops import TorchOps
from rtp_llm.sampling.params import SamplingParams
from rtp_llm.sampling.penalties import PenaltyRows, TokenCounts, apply_penalties


@dataclass
class SamplingBatch:
    temperature: torch.Tensor          # [R] float32 (1 where greedy)
    greedy: torch.Tensor               # [R] bool
    top_k: Optional[torch.Tensor]      # [R] int64, None when no row uses it
    top_p: Optional[torch.Tensor]      # [R] float32, None when no row uses it
    min_p: Optional[torch.Tensor]      # [R] float32
    repetition: Optional[torch.Tensor]  # [R] float32
    presence: Optional[torch.Tensor]
    frequency: Optional[torch.Tensor]
    penalties: Optional[PenaltyRows]   # the tokens each penalised row has seen, when a row has a penalty
    seeds: torch.Tensor                # [R] int64
    steps: torch.Tensor                # [R] int64: tokens generated so far by each request
    all_greedy: bool
    any_greedy: bool
    num_logprobs: int                  # max top logprobs over rows; -1 = none asked
    allowed: Optional[torch.Tensor] = None     # [R, V] bool: False where allowed_token_ids excludes a token
    banned: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (rows, ids): bad words' next tokens
    bias: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None  # (rows, ids, values): logit_bias
    grammar: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (rows [G], allowed [G, V] bool): grammar masks

    @classmethod
    def build(cls, params: Sequence[SamplingParams], seeds: Sequence[int], steps: Sequence[int],
              prompt_tokens: Sequence[Sequence[int]], output_tokens: Sequence[Sequence[int]],
              vocab_size: int, device="cpu", counts: Optional[Sequence[Optional[TokenCounts]]] = None
              ) -> "SamplingBatch":
        """counts: each row's TokenCounts where the caller keeps them (penalised rows; None elsewhere); without
        them the penalised rows' counts are made from prompt_tokens and output_tokens."""
        def col(values, dtype):
            return torch.tensor(values, dtype=dtype).to(device)

        greedy = [p.temperature == 0 for p in params]
        use_k = any(0 < p.top_k < vocab_size for p in params)
        use_p = any(p.top_p < 1 for p in params)
        use_min_p = any(p.min_p > 0 for p in params)
        use_rep = any(p.repetition_penalty != 1 for p in params)
        use_pf = any(p.presence_penalty != 0 or p.frequency_penalty != 0 for p in params)
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        allowed = banned = bias = None
        if any(p.allowed_token_ids is not None for p in params):
            mask = torch.ones(len(params), vocab_size, dtype=torch.bool)
            for i, p in enumerate(params):
                if p.allowed_token_ids is not None:
                    mask[i] = False
                    mask[i, torch.tensor(p.allowed_token_ids, dtype=torch.int64)] = True
            allowed = mask.to(device)
        ban = [(i, t) for i, p in enumerate(params) for t in bad_word_ends(p.bad_words_token_ids, output_tokens[i])]
        if ban:
            banned = (col([r for r, _ in ban], torch.int64), col([t for _, t in ban], torch.int64))
        add = [(i, int(t), float(v)) for i, p in enumerate(params) for t, v in (p.logit_bias or {}).items()]
        if add:
            bias = (col([a[0] for a in add], torch.int64), col([a[1] for a in add], torch.int64),
                    col([a[2] for a in add], torch.float32))
        return cls(
            temperature=col([1.0 if g else p.temperature for g, p in zip(greedy, params)], torch.float32),
            greedy=col(greedy, torch.bool),
            top_k=col([p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params], torch.int64)
            if use_k else None,
            top_p=col([p.top_p for p in params], torch.float32) if use_p else None,
            min_p=col([p.min_p for p in params], torch.float32) if use_min_p else None,
            repetition=col([p.repetition_penalty for p in params], torch.float32) if use_rep else None,
            presence=col([p.presence_penalty for p in params], torch.float32) if use_pf else None,
            frequency=col([p.frequency_penalty for p in params], torch.float32) if use_pf else None,
            penalties=PenaltyRows.build(
                counts if counts is not None else
                [TokenCounts(pt, ot) if p.penalises else None
                 for p, pt, ot in zip(params, prompt_tokens, output_tokens)], device)
            if (use_rep or use_pf) else None,
            seeds=col(list(seeds), torch.int64),
            steps=col(list(steps), torch.int64),
            all_greedy=all(greedy), any_greedy=any(greedy),
            num_logprobs=max(logprobs) if logprobs else -1,
            allowed=allowed, banned=banned, bias=bias,
        )


def bad_word_ends(words: Sequence[Sequence[int]], output: Sequence[int]) -> list[int]:
    """The tokens that would complete a bad word now: a word's last token where the output ends with the rest."""
    out = []
    for w in words:
        prefix = list(w[:-1])
        if not prefix or list(output[len(output) - len(prefix):]) == prefix:
            out.append(int(w[-1]))
    return out


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor                      # [R] int64
    logprobs: Optional[torch.Tensor] = None      # [R] float32: the sampled tokens' logprobs
    top_ids: Optional[torch.Tensor] = None       # [R, N] int64
    top_logprobs: Optional[torch.Tensor] = None  # [R, N] float32


@dataclass
class GreedyTokens:
    """What a model step returns instead of logits when every sampled row is greedy and nothing reshapes the
    logits (no penalties, logprobs or banned tokens): each row's argmax."""
    token_ids: torch.Tensor  # [R] int64

    @staticmethod
    def applies(params: SamplingParams) -> bool:
        return (params.temperature == 0 and params.n == 1 and params.logprobs is None and not params.penalises
                and not params.shapes_logits)


class Sampler:
    def __init__(self, ops=None):
        self.ops = ops or TorchOps()

    @staticmethod
    def shape_logits(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
        """allowed_token_ids and bad words (-inf), logit_bias (added), then the grammar masks, on a copy."""
        if b.allowed is None and b.banned is None and b.bias is None and b.grammar is None:
            return logits
        raw = logits
        logits = logits.clone()
        if b.allowed is not None:
            logits.masked_fill_(~b.allowed, float("-inf"))
        if b.banned is not None:
            logits[b.banned] = float("-inf")
        if b.bias is not None:
            logits.index_put_(b.bias[:2], b.bias[2].to(logits.dtype), accumulate=True)
        if b.grammar is not None:
            rows, allowed = b.grammar
            shaped = torch.where(allowed, logits.index_select(0, rows), float("-inf"))
            if b.allowed is not None or b.banned is not None:
                # allowed_token_ids or a bad word can leave nothing the grammar allows: the grammar wins.
                alone = torch.where(allowed, raw.index_select(0, rows), float("-inf"))
                shaped = torch.where(torch.isneginf(shaped.amax(dim=-1, keepdim=True)), alone, shaped)
            logits.index_copy_(0, rows, shaped)
        return logits

    @staticmethod
    def apply_penalties(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
        if b.penalties is None:
            return logits
        return apply_penalties(logits, b.penalties, b.repetition, b.presence, b.frequency)

    def __call__(self, logits: torch.Tensor, b: SamplingBatch) -> SamplerOutput:
        logits = logits.float()
        raw = logits
        logits = self.apply_penalties(self.shape_logits(logits, b), b)
        if b.all_greedy:
            token_ids = logits.argmax(dim=-1)
        else:
            greedy_ids = logits.argmax(dim=-1) if b.any_greedy else None
            logits = logits / b.temperature[:, None]
            logits = self.ops.top_k_top_p(logits, b.top_k, b.top_p)
            probs = torch.softmax(logits, dim=-1)
            if b.min_p is not None:
                keep = probs >= b.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
                probs = torch.where(keep, probs, torch.zeros((), device=probs.device))
            token_ids = self.ops.exponential_race(probs, b.seeds, b.steps)
            if greedy_ids is not None:
                token_ids = torch.where(b.greedy, greedy_ids, token_ids)
        out = SamplerOutput(token_ids=token_ids)
        if b.num_logprobs >= 0:
            logp = torch.log_softmax(raw, dim=-1)
            out.logprobs = logp.gather(-1, token_ids[:, None]).squeeze(-1)
            if b.num_logprobs > 0:
                out.top_logprobs, out.top_ids = logp.topk(b.num_logprobs, dim=-1)
        return out
