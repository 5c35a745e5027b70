"""SamplingParams: the OpenAI sampling fields and RTP-LLM's generate_config names for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from rtp_llm.sampling.structured_outputs import StructuredOutputs

@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0      # 0 = greedy
    top_k: int = 0                # 0 or -1 = no top-k
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    logprobs: Optional[int] = None  # number of top logprobs to return (0 = only the sampled token's, -1 = all)
    # vLLM's: each prompt token's logprob (from the first prompt token on) and this many top ones (-1 = all); such
    # a prompt is computed whole, not taken from the prefix cache (a cached position has no logits).
    prompt_logprobs: Optional[int] = None
    timeout_ms: Optional[int] = None
    # OpenAI's logit_bias: token id -> bias in [-100, 100], added to the logits before anything else samples them.
    logit_bias: Optional[dict[int, float]] = None
    # vLLM extras: sampling restricted to these ids; words (strings) the output may not contain. A word is banned
    # by its token ids (bad_words_token_ids, with and without a leading space, filled by the input processor): its
    # last token may not follow the rest of it.
    allowed_token_ids: Optional[list[int]] = None
    bad_words: list[str] = field(default_factory=list)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    # The output must match a JSON schema, a regex, a choice or a grammar (a dict is read as StructuredOutputs).
    structured_outputs: Optional[Union[StructuredOutputs, dict]] = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputs(**self.structured_outputs)
            except TypeError as exc:
                raise ValueError(f"structured_outputs: {exc}") from None
        checks = [
            ("max_tokens", self.max_tokens >= 1, "must be >= 1"),
            ("min_tokens", 0 <= self.min_tokens <= self.max_tokens, "must be in [0, max_tokens]"),
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_k", self.top_k >= -1, "must be -1, 0 (disabled) or a positive count"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("repetition_penalty", self.repetition_penalty > 0, "must be > 0"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("n", self.n >= 1, "must be >= 1"),
            ("logprobs", self.logprobs is None or self.logprobs >= -1, "must be >= 0, or -1 (whole vocabulary)"),
            ("prompt_logprobs", self.prompt_logprobs is None or self.prompt_logprobs >= -1,
             "must be >= 0, or -1 (whole vocabulary)"),
            ("timeout_ms", self.timeout_ms is None or self.timeout_ms > 0, "must be > 0"),
            ("logit_bias", all(-100 <= float(v) <= 100 for v in (self.logit_bias or {}).values()),
             "values must be in [-100, 100]"),
            ("allowed_token_ids", self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
             "must not be empty"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name} {rule}, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalises(self) -> bool:
        """Whether a repetition, presence or frequency penalty changes the logits of tokens already seen."""
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def shapes_logits(self) -> bool:
        """Whether a token mask or bias changes the logits before sampling (logit_bias, allowed ids, bad words,
        a grammar)."""
        return (bool(self.logit_bias) or self.allowed_token_ids is not None or bool(self.bad_words_token_ids)
                or self.structured_outputs is not None)

    def token_id_fields(self) -> dict[str, list[int]]:
        """The token ids each field names (for the vocabulary check, which reports the field)."""
        return {"stop_token_ids": list(self.stop_token_ids), "logit_bias": list(self.logit_bias or {}),
                "allowed_token_ids": list(self.allowed_token_ids or []),
                "bad_words": [t for word in self.bad_words_token_ids for t in word]}
