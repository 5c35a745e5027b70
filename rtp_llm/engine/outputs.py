"""What the engine hands its callers: per request, per sample, the new text/tokens of this step and the totals
so far (RequestOutput, as vLLM's), rebuilt by an OutputCollector from the core's per-step deltas."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    rank: Optional[int] = None  # the token's 1-based rank in its distribution (prompt logprobs)


@dataclass
class CompletionOutput:
    index: int
    text: str = ""                                    # all text so far
    token_ids: list[int] = field(default_factory=list)  # all tokens so far
    delta_text: str = ""                              # new this step
    delta_token_ids: list[int] = field(default_factory=list)
    logprobs: Optional[list[TokenLogprob]] = None     # all so far, when asked
    delta_logprobs: Optional[list[TokenLogprob]] = None
    finish_reason: Optional[str] = None               # stop | length | abort | error
    stop_reason: Optional[object] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    error: Optional[str] = None
    metrics: dict = field(default_factory=dict)  # arrival, first_token, finish times (monotonic)
    # vLLM's: per prompt position, the prompt token's logprob (None for the first token), when asked
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None

    @property
    def usage(self) -> dict:
        completion = sum(len(o.token_ids) for o in self.outputs)
        return {"prompt_tokens": len(self.prompt_token_ids), "completion_tokens": completion,
                "total_tokens": len(self.prompt_token_ids) + completion}


class OutputCollector:
    """Running totals of every open request, from the core's OutputDeltas (engine/protocol.py): a step's deltas
    carry only the new text, tokens and logprobs, so the core and the pipe do O(new tokens) per step."""

    def __init__(self):
        self._open: dict[str, tuple[list[int], dict[int, list], list]] = {}

    def add(self, delta) -> RequestOutput:
        entry = self._open.get(delta.request_id)
        if entry is None:
            entry = self._open[delta.request_id] = (list(delta.prompt_token_ids or []), {}, [None])
        prompt, samples, prompt_lps = entry
        if delta.prompt_logprobs is not None:
            prompt_lps[0] = delta.prompt_logprobs
        outs = []
        for d in delta.samples:
            s = samples.get(d.index)
            if s is None:
                s = samples[d.index] = ["", [], None if d.logprobs is None else []]
            s[0] += d.text
            s[1].extend(d.token_ids)
            if d.logprobs is not None:
                s[2].extend(d.logprobs)
            # Copies: an earlier output still queued for a slow consumer must not change under it.
            outs.append(CompletionOutput(d.index, s[0], list(s[1]), d.text, list(d.token_ids),
                                         None if s[2] is None else list(s[2]), d.logprobs, d.finish_reason,
                                         d.stop_reason))
        if delta.finished:
            del self._open[delta.request_id]
        return RequestOutput(delta.request_id, prompt, outs, delta.finished, delta.num_cached_tokens, delta.error,
                             delta.metrics, prompt_lps[0])

    def discard(self, request_id: str) -> None:
        self._open.pop(request_id, None)
