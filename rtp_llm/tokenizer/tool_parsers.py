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
    object (name given), or for "required" a JSON array of {"name", "parameters"} objects. Buffered to the end;
    an answer cut short (max_tokens) does not parse and is returned as content."""

    def __init__(self, name: Optional[str] = None):
        self.name = name
        self.buf = ""

    def feed(self, text: str) -> list:
        self.buf += text
        return []

    def finish(self) -> list:
        text, self.buf = self.buf, ""
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return [("content", text)] if text else []
        calls = [_call_from({"name": self.name, "arguments": value}, "arguments")] if self.name else (
            [_call_from(x, "parameters") for x in value] if isinstance(value, list) and value else [None])
        if any(c is None for c in calls):
            return [("content", text)]
        return [("call", c) for c in calls]


def forced_calls_schema(tools: list[dict], parallel: bool) -> dict:
    """tool_choice "required": a non-empty array of calls, each a tool's name with arguments valid for it."""
    variants = [{"type": "object", "properties": {"name": {"const": t["name"]},
                                                  "parameters": t.get("parameters") or {"type": "object"}},
                 "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    return schema
