"""Grammar-constrained sampling with llguidance: a StructuredOutputs becomes a grammar, each constrained sequence
carries a matcher (its parser state), and every step the matchers of the rows that sample write a token bitmask
that the sampler applies to the logits on the engine's device.

llguidance was chosen over xgrammar and outlines-core (benchmarks/ARCHIVE.md, "Structured outputs"): a 3 MB wheel
with no dependencies, no ahead-of-time compile (a matcher is ready in about a millisecond and computes masks
lazily), JSON schema, regex, Lark and GBNF in one engine; xgrammar needs apache-tvm-ffi and declares triton.

A matcher's state follows its sequence's output tokens, which preemption keeps (a recompute prefills them again);
speculation walks a copy of it along the drafts (masks_along). Siblings of n > 1 each get their own copy.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Optional, Sequence

import numpy as np
import torch

from rtp_llm.errors import RequestRejected
from rtp_llm.sampling.structured_outputs import StructuredOutputs, strict_schema

_CACHE_SIZE = 256
_PARAM = "structured_outputs"  # the server renames it to the field the request used
# Whitespace between JSON tokens: a space, or a newline and an indent of at most 20 (llama.cpp's json-schema rule).
# Unbounded whitespace lets a weak model fill max_tokens with blanks inside a valid document.
# Also the x-guidance of the %json blocks a route writes into a Lark grammar (serving_chat.calls_or_answer).
JSON_WHITESPACE = {"whitespace_pattern": r"(?: |\n[ \t]{0,20})"}
_COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_source(so: StructuredOutputs) -> str:
    """The llguidance grammar (its JSON form) for a StructuredOutputs."""
    import llguidance as llg

    kind = so.kind
    options = _COMPACT_JSON if so.disable_any_whitespace else JSON_WHITESPACE
    if kind == "json":
        schema = so.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise RequestRejected(f"the JSON schema is not valid JSON: {exc}", param=_PARAM) from None
        if not isinstance(schema, (dict, bool)):
            raise RequestRejected("a JSON schema must be an object", param=_PARAM)
        if so.strict:
            schema = strict_schema(schema)
        return llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)
    if kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=options)
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(so.regex)
    if kind == "choice":  # Lark string literals take JSON's escapes
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in so.choice))
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(so.grammar)
    except Exception as exc:  # the converter raises plain exceptions on GBNF it cannot read
        raise RequestRejected(f"the grammar is not valid GBNF or Lark: {exc}", param=_PARAM) from None
    return llg.LLMatcher.grammar_from_lark(lark)


class Grammar:
    """One sequence's matcher. `accept` follows every sampled token; the mask applies once `active` (after the
    StructuredOutputs' after_token_ids, when it has any)."""
    __slots__ = ("matcher", "after", "active")

    def __init__(self, matcher, after: Sequence[int] = ()):
        self.matcher = matcher
        self.after = tuple(after)
        self.active = not self.after

    def accept(self, token: int, output: Sequence[int]) -> Optional[str]:
        """Feeds the token just appended to `output`; returns an error message if the grammar refused it."""
        if not self.active:
            n = len(self.after)
            self.active = len(output) >= n and tuple(output[-n:]) == self.after
            return None
        if not self.matcher.consume_token(int(token)):
            return self.matcher.get_error() or f"token {token} does not fit the grammar"
        return None

    @property
    def done(self) -> bool:
        """The output is complete: the grammar takes no more tokens (EOS aside)."""
        return self.active and self.matcher.is_stopped()


class GrammarCompiler:
    """Per tokenizer: llguidance's tokenizer (built once, ~0.25 s for 49k tokens) and the compiled grammars, cached
    by what the request asked for. Thread-safe: the server's event loop checks requests while the engine builds
    matchers."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Sequence[int] = ()):
        self._source = tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(set(int(t) for t in eos_token_ids)) or (
            [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        self._lltok = None
        self._executor = None
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @property
    def lltokenizer(self):
        if self._lltok is None:
            import llguidance as llg

            n_vocab = max(self.vocab_size, self._source.vocab_size)
            self._lltok = llg.LLTokenizer(self._source.backend.to_str(), n_vocab=n_vocab, eos_token=self._eos or None)
        return self._lltok

    def _template(self, so: StructuredOutputs):
        key = so.key()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        import llguidance as llg

        matcher = llg.LLMatcher(self.lltokenizer, grammar_source(so), log_level=0)
        if matcher.is_error():
            raise RequestRejected(f"cannot compile the {so.kind} constraint: {matcher.get_error()}", param=_PARAM)
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher

    def cached(self, so: StructuredOutputs) -> bool:
        with self._lock:
            return so.key() in self._cache

    def check(self, so: StructuredOutputs) -> None:
        """Raises RequestRejected naming the problem when the constraint cannot be compiled."""
        self._template(so)

    def matcher(self, so: StructuredOutputs) -> Grammar:
        return Grammar(self._template(so).deep_copy(), so.after_token_ids)

    def masks(self, grammars: Sequence[Grammar], vocab: int) -> torch.Tensor:
        """[G, vocab] bool: the tokens each grammar allows next (host tensor)."""
        import llguidance as llg

        if self._executor is None:
            self._executor = llg.LLExecutor()
        words = (max(vocab, self.lltokenizer.vocab_size) + 31) // 32
        bits = np.zeros((len(grammars), words), dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr([(g.matcher, i) for i, g in enumerate(grammars)],
                                               bits.ctypes.data, words * 4, len(grammars))
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        return torch.from_numpy(allowed.astype(np.bool_))

    def masks_along(self, grammar: Grammar, drafts: Sequence[int], vocab: int) -> torch.Tensor:
        """[len(drafts) + 1, vocab] bool: the tokens the grammar allows now and after each draft in turn, from a copy
        of the matcher walked along the drafts (which it must accept: the speculator checked them); the sequence's
        own matcher stays where it is."""
        walker = Grammar(grammar.matcher.deep_copy())
        out = [self.masks([walker], vocab)]
        for t in drafts:
            if not walker.matcher.consume_token(int(t)):
                raise ValueError(f"draft token {t} does not fit the grammar")
            out.append(self.masks([walker], vocab))
        return torch.cat(out)
