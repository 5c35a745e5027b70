"""One chat choice's answer -> OpenAI message parts: the reasoning part first (--reasoning_parser), then tool calls
in what follows (--tool_call_parser, or the grammar-forced form of tool_choice required / a named function).
Streamed and whole answers go through the same incremental parsers, so a stream adds up to the whole answer."""

from __future__ import annotations

import json
import uuid
from typing import Optional

from rtp_llm.tokenizer.reasoning_parser import ReasoningParser
from rtp_llm.tokenizer.tool_parsers import ToolCall


class ChatOutputParser:
    def __init__(self, reasoning: Optional[str] = None, tools=None, reasoning_closed: bool = False,
                 echo: str = "", functions: Optional[dict] = None, parallel: bool = True):
        """reasoning: a reasoning parser's name (reasoning_closed: the prompt already ended the reasoning part);
        tools: a tool parser (tokenizer/tool_parsers.py) or None."""
        self.reasoning = ReasoningParser(reasoning, reasoning_closed) if reasoning else None
        self.tools = tools
        self.calls: list[ToolCall] = []
        self.content: list[str] = []
        self.reasoning_text: list[str] = []
        self.streamed_calls = 0
        self._kept = False
        self.echo = echo  # vLLM's chat echo: the continued message's text comes first in the content
        # tool_choice auto: the request's functions (name -> definition). A call naming another function, or a
        # strict one whose arguments do not validate, is returned as the content the model wrote; with
        # parallel_tool_calls false, calls after the first are dropped.
        self.functions = functions
        self.parallel = parallel

    def _route(self, pieces: list[tuple[str, str]], final: bool) -> list:
        out = []
        for kind, text in pieces:
            if kind == "reasoning":
                out.append(("reasoning", text))
            elif self.tools is None:
                out.append(("content", text))
            else:
                out.extend(self.tools.feed(text))
        if final and self.tools is not None:
            out.extend(self.tools.finish())
        return out

    def feed(self, text: str, final: bool = False) -> list:
        """New answer text -> events: ("reasoning", str), ("content", str), ("call", ToolCall), or a call in
        pieces: ("call_head", name) then ("call_args", text)..."""
        pieces = self.reasoning.feed(text) if self.reasoning else ([("content", text)] if text else [])
        if final and self.reasoning:
            pieces += self.reasoning.finish()
        events = [self._checked(e) for e in self._route(pieces, final)]
        events = [e for e in events if e is not None and not (e[0] != "call" and not e[1])]
        if self.echo:
            events.insert(0, ("content", self.echo))
            self.echo = ""
        for kind, value in events:
            if kind == "call":
                self.calls.append(value)
            elif kind == "call_head":  # a forced call streamed: its name, then its arguments in pieces
                self.calls.append(ToolCall(value, ""))
            elif kind == "call_args":
                self.calls[-1].arguments += value
            elif kind == "content":
                self.content.append(value)
            else:
                self.reasoning_text.append(value)
        return events

    def _checked(self, event):
        if event[0] != "call" or self.functions is None:
            return event
        call = event[1]
        fn = self.functions.get(call.name)
        if fn is None or (fn.get("strict") and not _valid(call.arguments, fn.get("parameters"))):
            return "content", call.raw
        if not self.parallel and (self.calls or self._kept):
            return None
        self._kept = True
        return event

    def finish_reason(self, engine_reason: Optional[str]) -> Optional[str]:
        return "tool_calls" if self.calls and engine_reason == "stop" else engine_reason

    # --- OpenAI shapes ---------------------------------------------------------------------------------
    def delta(self, event) -> list[dict]:
        """A streamed event as chunk deltas (calls numbered in the order they are streamed)."""
        kind, value = event
        if kind == "reasoning":
            return [{"reasoning_content": value}]
        if kind == "content":
            return [{"content": value}]
        if kind == "call_args":
            return [{"tool_calls": [{"index": self.streamed_calls - 1, "function": {"arguments": value}}]}]
        if kind == "call_head":
            call_index, self.streamed_calls = self.streamed_calls, self.streamed_calls + 1
            return [{"tool_calls": [{"index": call_index, "id": new_call_id(), "type": "function",
                                     "function": {"name": value, "arguments": ""}}]}]
        # A whole call: its id and name first, then its arguments (OpenAI's delta form).
        call_index, self.streamed_calls = self.streamed_calls, self.streamed_calls + 1
        return [{"tool_calls": [{"index": call_index, "id": new_call_id(), "type": "function",
                                 "function": {"name": value.name, "arguments": ""}}]},
                {"tool_calls": [{"index": call_index, "function": {"arguments": value.arguments}}]}]

    def message(self) -> dict:
        msg: dict = {"role": "assistant", "content": "".join(self.content) if self.content or not self.calls
                     else None}
        if self.reasoning is not None:
            msg["reasoning_content"] = "".join(self.reasoning_text) if self.reasoning_text else None
        if self.calls:
            msg["tool_calls"] = [{"id": new_call_id(), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in self.calls]
        return msg


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _valid(arguments: str, schema: Optional[dict]) -> bool:
    """Whether a call's arguments satisfy its function's parameters schema (strict functions)."""
    import jsonschema

    if not schema:
        return True
    try:
        jsonschema.validate(json.loads(arguments), schema)
        return True
    except (jsonschema.ValidationError, json.JSONDecodeError):
        return False
    except jsonschema.SchemaError:
        return False
