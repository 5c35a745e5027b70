"""SpeculativeConfig: vLLM's --speculative_config, read from its JSON (or a dict in LLM(...)).

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    {"method": "draft_model", "model": "/path/to/draft", "num_speculative_tokens": 4}
    {"method": "lookup", "num_speculative_tokens": 4, "prompt_lookup_max": 4}   (an rtp-llm extension)

Every key the engine accepts is one it implements; any other is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

METHODS = ("ngram", "lookup", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: Optional[int] = None  # ngram: shortest suffix of the context to look up
    prompt_lookup_max: Optional[int] = None  # ngram: longest; lookup: its n-grams' longest (down to one token)
    model: Optional[str] = None              # draft_model: its checkpoint (the same tokenizer as the target)
    quantization: Optional[str] = None       # draft_model: as --quantization, for the draft (default: the target's)
    dtype: Optional[str] = None              # draft_model (an rtp-llm extension): its dtype (default: the target's)
    # Speculation pauses for a step whose decoding sequences are more than this (vLLM's name); None = the engine's
    # rule (rtp_llm/spec_decode/speculator.py).
    disable_by_batch_size: Optional[int] = None

    @classmethod
    def parse(cls, value: Union[None, str, dict, "SpeculativeConfig"]) -> Optional["SpeculativeConfig"]:
        """None / "" / {} -> None; a JSON string or a dict -> a checked SpeculativeConfig (ValueError names the
        problem)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}")
        if not value:
            return None
        d: dict[str, Any] = dict(value)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"speculative_config: unsupported key(s) {unknown}; supported: {sorted(known)}")
        method = d.get("method")
        if method in ("[ngram]", None) and d.get("model") in ("ngram", "[ngram]"):
            method, d["model"] = "ngram", None  # vLLM's older spelling: model "[ngram]"
        if method is None:
            method = "draft_model" if d.get("model") else None
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {list(METHODS)}, got {d.get('method')!r}")
        d["method"] = method
        k = d.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config.num_speculative_tokens must be a positive integer, got {k!r}")
        if method == "ngram":
            lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
            if lo is None and hi is None:
                lo = hi = 5  # vLLM's default
            lo = hi if lo is None else lo
            hi = lo if hi is None else hi
            for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"speculative_config.{name} must be a positive integer, got {v!r}")
            if lo > hi:
                raise ValueError(f"speculative_config: prompt_lookup_min={lo} exceeds prompt_lookup_max={hi}")
            if d.get("model") is not None:
                raise ValueError("speculative_config: method ngram takes no model")
            d["prompt_lookup_min"], d["prompt_lookup_max"] = lo, hi
        elif method == "lookup":
            if d.get("prompt_lookup_min") is not None:
                raise ValueError("speculative_config: method lookup reads n-grams from prompt_lookup_max tokens down "
                                 "to one (llama.cpp's lookup); it takes no prompt_lookup_min")
            hi = d.get("prompt_lookup_max", None)
            hi = 4 if hi is None else hi
            if not isinstance(hi, int) or isinstance(hi, bool) or hi < 1:
                raise ValueError(f"speculative_config.prompt_lookup_max must be a positive integer, got {hi!r}")
            if d.get("model") is not None:
                raise ValueError("speculative_config: method lookup takes no model")
            d["prompt_lookup_max"] = hi
        else:
            if not d.get("model"):
                raise ValueError("speculative_config: method draft_model needs a model (the draft's checkpoint)")
            for name in ("prompt_lookup_min", "prompt_lookup_max"):
                if d.get(name) is not None:
                    raise ValueError(f"speculative_config: {name} is for method ngram")
        if method != "draft_model":
            for name in ("quantization", "dtype"):
                if d.get(name) is not None:
                    raise ValueError(f"speculative_config: {name} is for method draft_model")
        if d.get("quantization") not in (None, "auto", "none", "int8"):
            raise ValueError(f"speculative_config.quantization must be auto, none or int8, got {d['quantization']!r}")
        if d.get("dtype") not in (None, "auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"speculative_config.dtype must be auto, float32, bfloat16 or float16, got {d['dtype']!r}")
        b = d.get("disable_by_batch_size")
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ValueError(f"speculative_config.disable_by_batch_size must be a positive integer, got {b!r}")
        return cls(**d)

    def check_query_limit(self, limit: Optional[int], device: str) -> None:
        """The device's limit on query tokens per request in a decode round (Device.max_decode_query_tokens)."""
        if limit is not None and self.num_speculative_tokens + 1 > limit:
            raise ValueError(f"speculative_config.num_speculative_tokens={self.num_speculative_tokens}: the {device}'s "
                             f"fused attention takes at most {limit} query tokens per request in a decode round "
                             f"(num_speculative_tokens + 1 <= {limit})")
