"""What the engine hands its callers: per request, per sample, what is new since the caller's previous output and
the totals so far (RequestOutput, as vLLM's). A RequestState rebuilds them from the core's per-step deltas.

Totals are views of an append-only record, copied out only when read: making an output costs O(new tokens), so
a streamed answer costs O(length) in all, not O(length^2), however often its consumer takes outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    rank: Optional[int] = None  # the token's 1-based rank in its distribution (prompt logprobs)


class SampleRecord:
    """One sample's output so far; append-only, so a (tokens, text pieces, logprobs) count is a snapshot."""
    __slots__ = ("tokens", "pieces", "logprobs")

    def __init__(self, with_logprobs: bool):
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.logprobs: Optional[list[TokenLogprob]] = [] if with_logprobs else None


class CompletionOutput:
    """One sample as of one output: its news (delta_*) and its totals (text, token_ids, logprobs), the totals
    copied out of the record on first read."""
    __slots__ = ("index", "delta_text", "delta_token_ids", "delta_logprobs", "finish_reason", "stop_reason",
                 "_record", "_counts", "_totals")

    def __init__(self, index: int, text: str = "", token_ids=(), delta_text: str = "", delta_token_ids=(),
                 logprobs=None, delta_logprobs=None, finish_reason: Optional[str] = None, stop_reason=None):
        self.index = index
        self.delta_text, self.delta_token_ids, self.delta_logprobs = delta_text, list(delta_token_ids), delta_logprobs
        self.finish_reason, self.stop_reason = finish_reason, stop_reason  # stop | length | abort | error
        self._record = None
        self._counts = (len(token_ids), 0, 0)
        self._totals = (text, list(token_ids), None if logprobs is None else list(logprobs))

    @classmethod
    def view(cls, index: int, record: SampleRecord, delta_text: str, delta_token_ids: list[int], delta_logprobs,
             finish_reason: Optional[str], stop_reason) -> "CompletionOutput":
        out = cls.__new__(cls)
        out.index = index
        out.delta_text, out.delta_token_ids, out.delta_logprobs = delta_text, delta_token_ids, delta_logprobs
        out.finish_reason, out.stop_reason = finish_reason, stop_reason
        out._record = record
        out._counts = (len(record.tokens), len(record.pieces), 0 if record.logprobs is None else len(record.logprobs))
        out._totals = None
        return out

    def _materialise(self) -> tuple:
        if self._totals is None:
            r, (n, k, m) = self._record, self._counts
            self._totals = ("".join(r.pieces[:k]), r.tokens[:n], None if r.logprobs is None else r.logprobs[:m])
            self._record = None
        return self._totals

    @property
    def text(self) -> str:
        return self._materialise()[0]

    @property
    def token_ids(self) -> list[int]:
        return self._materialise()[1]

    @property
    def logprobs(self) -> Optional[list[TokenLogprob]]:
        return self._materialise()[2]

    @property
    def num_tokens(self) -> int:
        """len(token_ids) without copying them."""
        return self._counts[0]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"CompletionOutput(index={self.index}, text={self.text!r}, token_ids={self.token_ids}, "
                f"finish_reason={self.finish_reason!r})")


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
    pooled: Optional[list[float]] = None  # a pooling request's embedding or scores (--runner pooling)

    @property
    def num_output_tokens(self) -> int:
        return sum(o.num_tokens for o in self.outputs)

    @property
    def usage(self) -> dict:
        completion = self.num_output_tokens
        return {"prompt_tokens": len(self.prompt_token_ids), "completion_tokens": completion,
                "total_tokens": len(self.prompt_token_ids) + completion}


class _Sample:
    """A sample's record, how much of it the consumer has taken, and its latest finish state."""
    __slots__ = ("record", "taken", "finish_reason", "stop_reason")

    def __init__(self, with_logprobs: bool):
        self.record = SampleRecord(with_logprobs)
        self.taken = (0, 0, 0)
        self.finish_reason, self.stop_reason = None, None


class RequestState:
    """One request's outputs on the consumer's side: apply() the core's OutputDeltas (engine/protocol.py) as they
    come, take() one RequestOutput covering everything applied since the previous take. A consumer that falls
    behind costs the record it keeps anyway, not one output per step."""
    __slots__ = ("request_id", "prompt_token_ids", "samples", "finished", "num_cached_tokens", "error", "metrics",
                 "prompt_logprobs", "pending", "pooled")

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.prompt_token_ids: list[int] = []
        self.samples: dict[int, _Sample] = {}
        self.finished = False
        self.num_cached_tokens = 0
        self.error: Optional[str] = None
        self.metrics: dict = {}
        self.prompt_logprobs = None
        self.pooled = None
        self.pending = False  # applied deltas not yet taken

    def apply(self, delta) -> None:
        if delta.prompt_token_ids is not None:
            self.prompt_token_ids = delta.prompt_token_ids
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.pooled is not None:
            self.pooled = delta.pooled
        for d in delta.samples:
            s = self.samples.get(d.index)
            if s is None:
                s = self.samples[d.index] = _Sample(d.logprobs is not None)
            r = s.record
            r.tokens.extend(d.token_ids)
            if d.text:
                r.pieces.append(d.text)
            if d.logprobs is not None:
                r.logprobs.extend(d.logprobs)
            s.finish_reason, s.stop_reason = d.finish_reason, d.stop_reason
        self.finished = delta.finished
        self.num_cached_tokens, self.error = delta.num_cached_tokens, delta.error
        if delta.metrics:
            self.metrics = delta.metrics
        self.pending = True

    def take(self) -> RequestOutput:
        outs = []
        for index, s in self.samples.items():
            r, (n, k, m) = s.record, s.taken
            lps = None if r.logprobs is None else r.logprobs[m:]
            out = CompletionOutput.view(index, r, "".join(r.pieces[k:]), r.tokens[n:], lps, s.finish_reason,
                                        s.stop_reason)
            s.taken = out._counts
            outs.append(out)
        self.pending = False
        return RequestOutput(self.request_id, self.prompt_token_ids, outs, self.finished, self.num_cached_tokens,
                             self.error, self.metrics, self.prompt_logprobs, self.pooled)


class OutputCollector:
    """RequestOutputs of a core driven on this thread (the offline LLM, tests): each delta applied and taken."""

    def __init__(self):
        self._open: dict[str, RequestState] = {}

    def add(self, delta) -> RequestOutput:
        state = self._open.get(delta.request_id)
        if state is None:
            state = self._open[delta.request_id] = RequestState(delta.request_id)
        state.apply(delta)
        if delta.finished:
            del self._open[delta.request_id]
        return state.take()
