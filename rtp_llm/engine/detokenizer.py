"""Incremental detokenisation with stop strings.

Text deltas are UTF-8 safe: a token that ends inside a multi-byte character decodes to U+FFFD, so
its text is held back until the character completes. Only a small window of recent tokens is
decoded per step (prefix/read offsets, as in vLLM / TGI), not the whole output.

Stop strings are found across token boundaries in the accumulated text. A tail of the text that
could still grow into a stop string is held back, so a stop string is never emitted, not even
partly; the text stops just before it.
"""

from __future__ import annotations

from typing import Optional, Sequence


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: Sequence[str] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.skip_special = skip_special_tokens
        self.tokens: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""        # all decoded text so far (stop string excluded once found)
        self.emitted = 0      # characters of self.text already returned as deltas
        self.stopped_by: Optional[str] = None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add(self, token_id: int) -> str:
        """Adds one token; returns the new text that is safe to emit (maybe empty)."""
        if self.stopped_by is not None:
            return ""
        self.tokens.append(token_id)
        prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
        if self.stop:
            self._check_stop()
        return self._take(final=self.stopped_by is not None)

    def _check_stop(self) -> None:
        longest = max(len(s) for s in self.stop)
        start = max(0, self.emitted - longest)
        best = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            self.text = self.text[: best[0]]
            self.stopped_by = best[1]

    def _holdback(self) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return hold

    def _take(self, final: bool) -> str:
        end = len(self.text) if final or not self.stop else len(self.text) - self._holdback()
        if end <= self.emitted:
            return ""
        out = self.text[self.emitted:end]
        self.emitted = end
        return out

    def flush(self) -> str:
        """At the end of a sequence (not stopped by a string): whatever was held back."""
        return self._take(final=True)
