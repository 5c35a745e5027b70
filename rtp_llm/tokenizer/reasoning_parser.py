"""Reasoning parsers (vLLM's --reasoning_parser): split a model's answer into its reasoning (`<think>...</think>`)
and the content after it, incrementally, so a stream's pieces add up to the whole answer's split.

qwen3: the answer may open with <think>; without one it is all content (enable_thinking=False).
deepseek_r1: the template opens <think> in the prompt, so the answer starts inside the reasoning.
"""

from __future__ import annotations

REASONING_PARSERS = ("qwen3", "deepseek_r1")
THINK_START, THINK_END = "<think>", "</think>"


def partial_tail(text: str, tag: str) -> int:
    """Length of the longest tail of text that is a proper prefix of tag (held back: it may become the tag)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningParser:
    def __init__(self, name: str, closed: bool = False):
        """closed: the prompt already ended the reasoning part (a template switch such as enable_thinking=false):
        the answer is all content."""
        if name not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {name!r}; use one of {', '.join(REASONING_PARSERS)}")
        self.state = "content" if closed else "reasoning" if name == "deepseek_r1" else "start"
        self.buf = ""
        # content right after </think>: its leading newlines are the template's, not the answer's
        self.lead = not closed

    def feed(self, text: str) -> list[tuple[str, str]]:
        """New text -> [(kind, text)] with kind "reasoning" or "content"."""
        self.buf += text
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":
                stripped = self.buf.lstrip()
                if stripped.startswith(THINK_START):
                    self.buf = stripped[len(THINK_START):]
                    self.state = "reasoning"
                    continue
                if THINK_START.startswith(stripped):  # still could be the opening tag (or only blanks so far)
                    return out
                self.state, self.lead = "content", False
                continue
            if self.state == "reasoning":
                i = self.buf.find(THINK_END)
                if i >= 0:
                    if i:
                        out.append(("reasoning", self.buf[:i]))
                    self.buf = self.buf[i + len(THINK_END):]
                    self.state = "content"
                    continue
                keep = partial_tail(self.buf, THINK_END)
                if len(self.buf) > keep:
                    out.append(("reasoning", self.buf[:len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep:]
                return out
            # content
            if self.lead:
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    return out
                self.lead = False
            if self.buf:
                out.append(("content", self.buf))
                self.buf = ""
            return out

    def finish(self) -> list[tuple[str, str]]:
        """The end of the answer: whatever was held back."""
        rest, self.buf = self.buf, ""
        if self.state == "reasoning":
            kind = "reasoning"
        elif self.state == "content" and self.lead:
            kind, rest = "content", rest.lstrip("\n")
        else:
            kind = "content"
        return [(kind, rest)] if rest else []
