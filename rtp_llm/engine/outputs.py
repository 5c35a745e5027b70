"""What the engine returns: per request, per sample, the new text/tokens of this step and totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


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

    @property
    def usage(self) -> dict:
        completion = sum(len(o.token_ids) for o in self.outputs)
        return {"prompt_tokens": len(self.prompt_token_ids), "completion_tokens": completion,
                "total_tokens": len(self.prompt_token_ids) + completion}
