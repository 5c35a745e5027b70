"""Tool-call parsers (vLLM's --tool_call_parser): find the calls in a model's answer, incrementally, so a stream
yields the same content and calls as the whole answer.

hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen2.5, Qwen3, Hermes), text around
them is content. llama3_json: the whole answer is `{"name": ..., "parameters": {...}}` objects separated by `;`
(Llama 3.1 / 3.2 with JSON tool calling). A call that does not parse stays in the content, as the model wrote it.

Events: ("content", text) or ("call", ToolCall). A call is only reported once complete, so a malformed one can
still go back to the content; its name and arguments then go out as two stream chunks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from rtp_llm.tokenizer.reasoning_parser import partial_tail

TOOL_CALL_PARSERS = ("hermes", "llama3_json")
CALL_START, CALL_END = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments
    raw: str = field(default="", compare=False)  # the model's text of the call (content again if it is refused)


def _call_from(obj, args_key: str, raw: str = "") -> Optional[ToolCall]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False), raw)


def detect_tool_parser(chat_template: Optional[str]) -> Optional[str]:
    """The parser a chat template's own tool-call format implies, when unambiguous."""
    if not chat_template:
        return None
    hermes = CALL_START in chat_template
    llama = "<|python_tag|>" in chat_template or ("ipython" in chat_template and '"parameters"' in chat_template)
    if hermes != llama:
        return "hermes" if hermes else "llama3_json"
    return None


def fallback_tool_template(chat_template: Optional[str]) -> Optional[tuple[str, str, str]]:
    """(name, template, parser) for a chat template that never mentions tools, by its family: ChatML models get
    the Hermes format (templates/chatml_tools.jinja). None where the template shows tools or no family fits."""
    if not chat_template or "tools" in chat_template or "<|im_start|>" not in chat_template:
        return None
    import os

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "chatml_tools.jinja")) as f:
        return "chatml_tools", f.read(), "hermes"


class HermesParser:
    def __init__(self):
        self.buf = ""
        self.in_call = False
        self.blank = ""  # whitespace held back: dropped if a call or the end follows it

    def _content(self, text: str, out: list) -> None:
        if not text:
            return
        text = self.blank + text
        body = text.rstrip()
        self.blank = text[len(body):]
        if body:
            out.append(("content", body))

    def feed(self, text: str) -> list:
        self.buf += text
        out: list = []
        while True:
            if not self.in_call:
                i = self.buf.find(CALL_START)
                if i < 0:
                    keep = partial_tail(self.buf, CALL_START)
                    self._content(self.buf[:len(self.buf) - keep], out)
                    self.buf = self.buf[len(self.buf) - keep:]
                    return out
                self._content(self.buf[:i], out)
                self.blank = ""
                self.buf, self.in_call = self.buf[i + len(CALL_START):], True
            i = self.buf.find(CALL_END)
            if i < 0:
                return out
            body, self.buf, self.in_call = self.buf[:i], self.buf[i + len(CALL_END):], False
            out.append(self._block(body, closed=True))

    def _block(self, body: str, closed: bool):
        try:
            call = _call_from(json.loads(body), "arguments", CALL_START + body + (CALL_END if closed else ""))
        except json.JSONDecodeError:
            call = None
        if call is not None:
            return "call", call
        return "content", CALL_START + body + (CALL_END if closed else "")

    def finish(self) -> list:
        out: list = []
        if self.in_call:
            out.append(self._block(self.buf, closed=False))
        elif self.buf:
            self._content(self.buf, out)
        self.buf = ""
        return out


class Llama3JsonParser:
    def __init__(self):
        self.buf = ""
        self.mode: Optional[str] = None  # "json" (buffer to the end) or "text" (stream as content)

    def feed(self, text: str) -> list:
        self.buf += text
        if self.mode is None:
            head = self.buf.lstrip()
            if not head:
                return []
            self.mode = "json" if head.startswith("{") else "text"
        if self.mode == "text":
            out, self.buf = [("content", self.buf)], ""
            return out
        return []

    def finish(self) -> list:
        text, self.buf = self.buf, ""
        if self.mode != "json":
            return [("content", text)] if text else []
        calls, pos, dec = [], 0, json.JSONDecoder()
        body = text.strip()
        while pos < len(body):
            try:
                obj, end = dec.raw_decode(body, pos)
            except json.JSONDecodeError:
                return [("content", text)]
            call = _call_from(obj, "parameters", body[pos:end])
            if call is None:
                return [("content", text)]
            calls.append(("call", call))
            pos = end
            m = re.compile(r"\s*;?\s*").match(body, pos)
            pos = m.end()
        return calls


def make_tool_parser(name: str):
    if name == "hermes":
        return HermesParser()
    if name == "llama3_json":
        return Llama3JsonParser()
    raise ValueError(f"unknown tool call parser {name!r}; use one of {', '.join(TOOL_CALL_PARSERS)}")


class ForcedCallParser:
    """The answer of a request whose tool_choice forced the calls with a grammar: a named function's arguments
    object (name given), or for "required" a JSON array of {"name", "parameters"} objects (the grammar writes
    name first). Incremental: a call's name goes out as soon as it is complete, then its arguments as they come
    ("call_head" / "call_args" events), so an answer cut by max_tokens is still a call, with the arguments written
    so far, as OpenAI and vLLM return it."""

    _HEAD = re.compile(r'\s*[\[,]\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"parameters"\s*:\s*')

    def __init__(self, name: Optional[str] = None):
        self.name = name
        self.buf = ""
        self.state = "args" if name else "head"  # head -> args -> tail -> head ... (required)
        self.started = False  # the named call's head is out
        self.depth = 0
        self.in_string = self.escape = False
        self.calls = 0

    def feed(self, text: str) -> list:
        self.buf += text
        out: list = []
        while self.buf:
            if self.state == "head":
                m = self._HEAD.match(self.buf)
                if m is None:
                    return out
                self.buf = self.buf[m.end():]
                out.append(("call_head", json.loads(m.group(1))))
                self.calls += 1
                self.state = "args"
            elif self.state == "args":
                if self.name and not self.started:
                    out.append(("call_head", self.name))
                    self.started, self.calls = True, 1
                if self.depth == 0:  # nothing of the arguments yet: the blank after "parameters": is not theirs
                    self.buf = self.buf.lstrip()
                    if not self.buf:
                        return out
                end = self._args_end()
                taken, self.buf = (self.buf, "") if end is None else (self.buf[:end], self.buf[end:])
                out.append(("call_args", taken))
                if end is not None:
                    self.state = "done" if self.name else "tail"
            elif self.state == "tail":
                rest = self.buf.lstrip()
                if rest.startswith("}"):
                    self.buf = rest[1:]
                    continue
                if rest.startswith(","):
                    self.buf, self.state = rest, "head"
                    continue
                if rest.startswith("]"):
                    self.buf, self.state = rest[1:], "done"
                    continue
                self.buf = rest
                return out
            else:  # done: the grammar allows nothing after the calls
                return out
        return out

    def _args_end(self) -> Optional[int]:
        """Where the arguments object in buf ends (its closing brace included), or None if not yet."""
        for i, ch in enumerate(self.buf):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None

    def finish(self) -> list:
        """What never became a call (a cut before a name was complete) is content."""
        text, self.buf = self.buf, ""
        if self.name and not self.started:
            return [("call_head", self.name), ("call_args", text)]
        return [("content", text)] if text.strip() and self.calls == 0 else []


class BareJsonCalls:
    """tool_choice auto: an answer that is, as a whole, one JSON call of a declared tool, or a list of them, in
    the `arguments` or `parameters` form ({"name": "get_weather", "arguments": {...}}) is a call, though the
    model wrote no tags (small models often do). Such an answer is buffered to its end; any other answer goes to
    the family's parser as it comes."""

    def __init__(self, inner, names):
        self.inner = inner
        self.names = set(names)
        self.buf = ""
        self.mode: Optional[str] = None  # "json" or "inner"

    def feed(self, text: str) -> list:
        if self.mode == "inner":
            return self.inner.feed(text)
        self.buf += text
        head = self.buf.lstrip()
        if not head:
            return []
        if head[0] in "{[":
            self.mode = "json"
            return []
        self.mode, text, self.buf = "inner", self.buf, ""
        return self.inner.feed(text)

    def finish(self) -> list:
        if self.mode == "json":
            calls = self._calls(self.buf.strip())
            if calls is not None:
                return [("call", c) for c in calls]
            text, self.buf = self.buf, ""
            return self.inner.feed(text) + self.inner.finish()
        return self.inner.finish()

    def _calls(self, body: str) -> Optional[list]:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return None
        items = value if isinstance(value, list) and value else [value]
        calls = [_call_from(x, "parameters" if isinstance(x, dict) and "parameters" in x else "arguments", body)
                 for x in items]
        if any(c is None or c.name not in self.names for c in calls):
            return None
        return calls


def forced_calls_schema(tools: list[dict], parallel: bool) -> dict:
    """tool_choice "required": a non-empty array of calls, each a tool's name with arguments valid for it."""
    variants = [{"type": "object", "properties": {"name": {"const": t["name"]},
                                                  "parameters": t.get("parameters") or {"type": "object"}},
                 "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    return schema
