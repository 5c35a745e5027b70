"""Requests and their sequences, as the core tracks them.

A Request holds one prompt and n Sequences (n > 1 for several samples). Sequence 0 computes the prompt; its
siblings are forked from it when its prefill completes, sharing the prompt's KV blocks, and each samples its own
first token from the same logits.

A sequence's tokens are prompt + output. `num_computed_tokens` of them have KV in the cache. The next step
computes tokens[num_computed_tokens:] (a whole or partial prefill, or the one last sampled token when decoding);
when that reaches the end, the last row's logits give the next token. A speculating sequence computes its last
token plus `draft` (rtp_llm/spec_decode/), and every one of those rows samples. A preempted sequence is recomputed
the same way: its prompt and output are prefilled again.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Optional

from rtp_llm.engine.detokenizer import IncrementalDetokenizer
from rtp_llm.sampling.grammar import Grammar
from rtp_llm.sampling.params import SamplingParams
from rtp_llm.sampling.penalties import TokenCounts


class SeqState(enum.Enum):
    WAITING = "waiting"        # not admitted yet, or preempted and waiting for recompute
    RUNNING = "running"
    PENDING_FORK = "pending_fork"  # a sibling waiting for sequence 0's prefill
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(eq=False)  # identity semantics: sequences are compared and looked up by object
class Sequence:
    seq_id: int
    request: "Request"
    index: int
    seed: int
    detok: IncrementalDetokenizer
    output: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)     # per output token: TokenLogprob, when asked
    state: SeqState = SeqState.WAITING
    num_computed_tokens: int = 0   # tokens whose KV is in the cache
    admitted_at: int = -1          # admission counter: the newest running sequence is preempted first
    finish_reason: Optional[FinishReason] = None
    stop_reason: Optional[object] = None  # the stop string or token id that ended it
    preemptions: int = 0
    grammar: Optional[Grammar] = None  # the matcher of a structured-output request
    token_counts: Optional[TokenCounts] = None  # a penalised sequence's seen tokens (the model runner's)
    # Speculative decoding: this step's drafted tokens to verify, and the back-off after rejected drafts.
    draft: list[int] = field(default_factory=list)
    spec_misses: int = 0
    spec_skip: int = 0
    spec_record: Optional[tuple[float, float]] = None  # recent accepted / rejected drafts (spec_decode/speculator.py)

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_ids) + len(self.output)

    def token_at(self, i: int) -> int:
        p = self.request.prompt_ids
        return p[i] if i < len(p) else self.output[i - len(p)]

    def all_tokens(self) -> list[int]:
        return self.request.prompt_ids + self.output

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next sample."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.state == SeqState.FINISHED

    @property
    def stop_ids_banned(self) -> bool:
        """min_tokens: the request's stop tokens may not be sampled yet."""
        return self.bans_stop_ids(0)

    def bans_stop_ids(self, ahead: int) -> bool:
        """Whether min_tokens bans the stop tokens at the token `ahead` drafts from now."""
        return len(self.output) + ahead < self.request.params.min_tokens and bool(self.request.min_tokens_ids)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int] = frozenset()  # the token ids that end a sample: stop_token_ids, EOS unless ignored
    # What min_tokens holds back: stop_token_ids and EOS even with ignore_eos (as vLLM: its stop-id set always has EOS)
    min_tokens_ids: frozenset[int] = frozenset()
    arrival: float = field(default_factory=time.monotonic)
    sequences: list[Sequence] = field(default_factory=list)
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None
    error: Optional[str] = None
    cached_tokens: int = 0         # prompt tokens served from the prefix cache at first admission
    computed_prompt_tokens: int = 0  # prompt tokens actually computed (recomputes included)
    deadline: Optional[float] = None
    announced: bool = False        # its first delta (with the prompt ids) has gone out
    prompt_logprobs: list = field(default_factory=list)  # TokenLogprob of prompt tokens 1.., computed so far
    # A pooling request (rtp_llm/pooling/): its params, which prompt rows it reads beyond the last ("all",
    # "first" or ""), the rows gathered so far, and its result.
    lora_id: int = 0  # its LoRA adapter's id (0: the base model)
    lora_key: int = 0  # its adapter's prefix-cache key: new at every load, so an id reused after unload misses
    pooling: Optional[object] = None
    pool_wanted: str = ""
    pool_rows: Optional[object] = None
    pooled: Optional[list] = None

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Asked for, and not all computed yet: sequence 0 computes every prompt position (no cached prefix)."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids) - 1

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.sequences)
