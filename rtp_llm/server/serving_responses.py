"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API on the chat machinery. The input
items (and, with previous_response_id, the stored conversation before them) become chat messages; the request
becomes a ChatCompletionRequest and runs the same plan as chat (template, grammar, tool and reasoning parsers);
the parsed answer comes back as output items: reasoning, message, function_call."""

from __future__ import annotations

import json
import time
import uuid
from typing import Optional

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from rtp_llm.server.chat_parsing import new_call_id
from rtp_llm.server.http_errors import APIError
from rtp_llm.server.protocol import ChatCompletionRequest
from rtp_llm.server.protocol_responses import NamedTool, ResponsesRequest
from rtp_llm.server.serving import Server
from rtp_llm.server.serving_chat import plan_chat


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# --- the conversation ------------------------------------------------------------------------------------------
def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", p.get("refusal", "")) for p in content)


def chat_messages(items: list[dict], instructions: Optional[str]) -> list[dict]:
    """Responses input items -> chat messages: function calls join the assistant turn before them, a reasoning
    item becomes the next assistant turn's reasoning_content, instructions the system message."""
    msgs: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    reasoning = None
    for it in items:
        kind = it.get("type", "message")
        if kind == "reasoning":
            reasoning = (reasoning or "") + "".join(p["text"] for p in it.get("content") or it.get("summary") or [])
        elif kind == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": _text(it["output"])})
        elif kind == "function_call":
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            msgs.append({"role": it["role"], "content": _text(it["content"])})
        if reasoning is not None and kind in ("message", "function_call") and msgs[-1]["role"] == "assistant":
            msgs[-1]["reasoning_content"], reasoning = reasoning, None
    return msgs


def chat_request(srv: Server, req: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    body: dict = {"messages": messages, "parallel_tool_calls": req.parallel_tool_calls, "temperature": req.temperature,
                  "top_p": req.top_p, "max_tokens": req.max_output_tokens, "seed": req.seed, "stop": req.stop,
                  "user": req.user, "response_format": req.response_format()}
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                         for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = ({"type": "function", "function": {"name": req.tool_choice.name}}
                               if isinstance(req.tool_choice, NamedTool) else req.tool_choice)
    if req.reasoning is not None and req.reasoning.effort is not None:
        if srv.reasoning_parser is None:
            raise APIError(400, "reasoning.effort needs a reasoning model: start the server with --reasoning_parser",
                           param="reasoning.effort")
        # what chat templates read: gpt-oss's reasoning_effort, Qwen3's enable_thinking
        body["chat_template_kwargs"] = {"reasoning_effort": req.reasoning.effort,
                                        "enable_thinking": req.reasoning.effort != "none"}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        raise APIError(400, f"input: the conversation is not a valid chat ({where}: {err.get('msg')})",
                       param="input") from None


def _fitting_plan(srv: Server, req: ResponsesRequest, items: list[dict]):
    """The chat plan of the conversation; with truncation auto, of its longest tail that starts at a user turn and
    fits max_model_len with the answer (OpenAI drops items from the beginning; cutting at a user turn never leaves a
    tool result without its call). What still does not fit is refused as any long prompt is."""
    while True:
        plan = plan_chat(srv, chat_request(srv, req, chat_messages(items, req.instructions)))
        if req.truncation != "auto" or len(plan.ids) + plan.params.max_tokens <= srv.max_model_len:
            return plan
        later = next((i for i in range(1, len(items))
                      if items[i].get("type", "message") == "message" and items[i].get("role") == "user"), None)
        if later is None:
            return plan
        items = items[later:]


# --- the answer ------------------------------------------------------------------------------------------------
def _reasoning_item(iid, text, status):
    return {"type": "reasoning", "id": iid, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": status}


def _message_item(iid, text, status):
    return {"type": "message", "id": iid, "status": status, "role": "assistant",
            "content": [_text_part(text)] if status != "in_progress" else []}


def _text_part(text):
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(iid, call_id, name, arguments, status):
    return {"type": "function_call", "id": iid, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def response_body(srv: Server, req: ResponsesRequest, rid: str, created: int, output: list, status: str,
                  usage: Optional[dict]) -> dict:
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else {
        "type": "text"}
    choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedTool) else (req.tool_choice or "auto")
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": srv.model_name,
            "output": output, "usage": usage, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "metadata": req.metadata or {}, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning.model_dump() if req.reasoning else None, "store": req.store,
            "temperature": req.temperature, "top_p": req.top_p, "text": {"format": fmt}, "tool_choice": choice,
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "truncation": req.truncation,
            "user": req.user}


def _usage(srv: Server, out, reasoning: str) -> dict:
    n_in, n_out = len(out.prompt_token_ids), out.num_output_tokens
    thought = len(srv.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
    # cache_write_tokens: the prompt tokens computed here (not read from the prefix cache)
    return {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": out.num_cached_tokens,
                                                           "cache_write_tokens": n_in - out.num_cached_tokens},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": min(thought, n_out)},
            "total_tokens": n_in + n_out}


# --- the routes ------------------------------------------------------------------------------------------------
async def create_response(srv: Server, req: ResponsesRequest, request: Request):
    lora = srv.check_model(req.model)
    before: list[dict] = []
    if req.previous_response_id is not None:
        found = srv.responses.get(req.previous_response_id)
        if found is None:
            raise APIError(404, f"previous response {req.previous_response_id!r} not found (never stored, deleted, "
                           f"or expired)", param="previous_response_id", code="not_found")
        before = found[1]
    given = ([{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str)
             else [it.model_dump(by_alias=True, exclude_none=True) for it in req.input])
    conversation = before + given
    plan = _fitting_plan(srv, req, conversation)
    rid, created = _id("resp"), int(time.time())
    [stream] = await srv.submit(request, [plan.ids], [plan.params], [rid], req.user, plan.names, lora=lora)

    def finish(body: dict) -> dict:
        if req.store:
            srv.responses.put(rid, body, conversation + body["output"])
        return body

    if req.stream:
        return StreamingResponse(srv.watched(_stream(srv, req, stream, rid, created, plan, finish), [stream]),
                                 media_type="text/event-stream")
    out = (await srv.collect(request, [stream]))[0]
    parser, ev = plan.make_parser(), _Events()  # the items as a stream would build them
    o = out.outputs[0]
    for kind, value in parser.feed(o.text, final=True):
        ev.piece(kind, value)
    status = "incomplete" if o.finish_reason == "length" else "completed"
    ev.finish(status)
    return finish(response_body(srv, req, rid, created, ev.items, status,
                                _usage(srv, out, "".join(parser.reasoning_text))))


def get_response(srv: Server, rid: str) -> dict:
    found = srv.responses.get(rid)
    if found is None:
        raise APIError(404, f"response {rid!r} not found (never stored, deleted, or expired)", param="response_id",
                       code="not_found")
    return found[0]


def delete_response(srv: Server, rid: str) -> dict:
    if not srv.responses.delete(rid):
        raise APIError(404, f"response {rid!r} not found (never stored, deleted, or expired)", param="response_id",
                       code="not_found")
    return {"id": rid, "object": "response", "deleted": True}


# --- streaming -------------------------------------------------------------------------------------------------
class _Events:
    """The Responses event sequence of one answer, numbered; items open as their first piece arrives and close
    when another kind begins or the answer ends."""

    def __init__(self):
        self.seq = 0
        self.items: list[dict] = []  # output items, as they will stand when done
        self.open: Optional[str] = None  # the kind of the last item while it is still open

    def event(self, kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def _add(self, item: dict, shown: dict) -> list[str]:
        self.items.append(item)
        return [self.event("response.output_item.added", output_index=len(self.items) - 1, item=shown)]

    def piece(self, kind: str, value) -> list[str]:
        out = []
        if kind != self.open or kind == "call_head" or kind == "call":
            out += self.close()
        i = len(self.items) - 1
        if kind == "reasoning":
            if self.open != "reasoning":
                iid = _id("rs")
                out += self._add(_reasoning_item(iid, "", "completed"),
                                 {**_reasoning_item(iid, "", "in_progress"), "content": []})
                i = len(self.items) - 1
            self.items[i]["content"][0]["text"] += value
            out.append(self.event("response.reasoning_text.delta", item_id=self.items[i]["id"], output_index=i,
                                  content_index=0, delta=value))
        elif kind == "content":
            if self.open != "content":
                iid = _id("msg")
                out += self._add(_message_item(iid, "", "completed"), _message_item(iid, "", "in_progress"))
                i = len(self.items) - 1
                out.append(self.event("response.content_part.added", item_id=iid, output_index=i, content_index=0,
                                      part=_text_part("")))
            self.items[i]["content"][0]["text"] += value
            if value:
                out.append(self.event("response.output_text.delta", item_id=self.items[i]["id"], output_index=i,
                                      content_index=0, delta=value, logprobs=[]))
        elif kind in ("call", "call_head"):
            name, args = (value.name, value.arguments) if kind == "call" else (value, "")
            iid, call_id = _id("fc"), new_call_id()
            out += self._add(_call_item(iid, call_id, name, "", "completed"),
                             _call_item(iid, call_id, name, "", "in_progress"))
            if args:
                out += self.piece_args(args)
            kind = "call_args"
        elif kind == "call_args":
            out += self.piece_args(value)
        self.open = kind
        return out

    def piece_args(self, text: str) -> list[str]:
        i = len(self.items) - 1
        self.items[i]["arguments"] += text
        return [self.event("response.function_call_arguments.delta", item_id=self.items[i]["id"], output_index=i,
                           delta=text)]

    def finish(self, status: str) -> list[str]:
        """The answer ended: an empty one is still one message (as OpenAI returns it); every item takes the
        response's status."""
        out = self.piece("content", "") if not self.items else []
        out += self.close()
        for item in self.items:
            item["status"] = status
        return out

    def close(self) -> list[str]:
        if self.open is None:
            return []
        i, item, out = len(self.items) - 1, self.items[-1], []
        if item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0,
                                  text=item["content"][0]["text"]))
        elif item["type"] == "message":
            part = item["content"][0]
            out.append(self.event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                                  text=part["text"], logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                                  part=part))
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                  name=item["name"], arguments=item["arguments"]))
        out.append(self.event("response.output_item.done", output_index=i, item=item))
        self.open = None
        return out


async def _stream(srv: Server, req: ResponsesRequest, stream, rid: str, created: int, plan, finish):
    ev = _Events()
    parser = plan.make_parser()
    yield ev.event("response.created", response=response_body(srv, req, rid, created, [], "in_progress", None))
    yield ev.event("response.in_progress", response=response_body(srv, req, rid, created, [], "in_progress", None))
    final = None
    async for _, out in srv.outputs([stream]):
        o = out.outputs[0]
        for kind, value in parser.feed(o.delta_text, final=o.finish_reason is not None):
            for line in ev.piece(kind, value):
                yield line
        final = out
    status = "incomplete" if final.outputs[0].finish_reason == "length" else "completed"
    for line in ev.finish(status):
        yield line
    body = finish(response_body(srv, req, rid, created, ev.items, status,
                                _usage(srv, final, "".join(parser.reasoning_text))))
    yield ev.event(f"response.{status}", response=body)
