"""POST /v1/chat/completions: the conversation through the chat template, tool_choice as a constraint, the
answer parsed into content, reasoning and tool calls (streamed as chunks or whole)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Optional

from fastapi import Request
from fastapi.responses import StreamingResponse

from rtp_llm.engine.client import RequestStream
from rtp_llm.errors import ChatTemplateError
from rtp_llm.sampling import SamplingParams
from rtp_llm.sampling.grammar import JSON_WHITESPACE
from rtp_llm.sampling.structured_outputs import strict_schema
from rtp_llm.server import openai_format as fmt
from rtp_llm.server.chat_parsing import ChatOutputParser
from rtp_llm.server.http_errors import APIError
from rtp_llm.server.protocol import ChatCompletionRequest
from rtp_llm.server.serving import Server
from rtp_llm.server.streams import DONE, sse, usage_flags
from rtp_llm.tokenizer.reasoning_parser import THINK_END, THINK_START
from rtp_llm.tokenizer.tool_parsers import BareJsonCalls, ForcedCallParser, forced_calls_schema, make_tool_parser


@dataclass
class ChatPlan:
    """A chat request made ready to run: its prompt ids, sampling parameters, the parser factory of its answer (one
    parser per choice) and the request's spelling of the fields an engine refusal names. /v1/responses runs the
    same plan."""
    ids: list[int]
    params: SamplingParams
    make_parser: Callable[[], ChatOutputParser]
    names: dict


def plan_chat(srv: Server, req: ChatCompletionRequest) -> ChatPlan:
    choice = req.effective_tool_choice()
    if choice == "auto" and srv.tool_parser is None:
        raise APIError(400, "tool_choice auto needs a tool call parser: start the server with --tool_call_parser "
                       "(hermes or llama3_json; this model's chat template does not say which), or use "
                       "tool_choice required or a named function", param="tool_choice")
    text = chat_text(srv, req.messages, req.add_generation_prompt, template_variables(req))
    if req.continue_final_message:
        text = _left_open(text, req.messages[-1].text())
    ids = srv.tokenizer.encode(text, add_special_tokens=False)  # the template writes the special tokens
    constraint, field = _tool_constraint(srv, req, choice)
    max_tokens = req.max_completion_tokens or req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = srv.params(req, max_tokens, logprobs, len(ids), constraint, field)
    closed = _reasoning_closed(text)
    if params.structured_outputs is not None and srv.reasoning_parser and not closed:
        params.structured_outputs.after_token_ids = tuple(srv.think_end_ids)  # constrain the answer only
    names = {"logprobs": "top_logprobs", "structured_outputs": field or req.structured()[1] or "structured_outputs"}
    return ChatPlan(ids, params, _parser_factory(srv, req, choice, closed), names)


async def create_chat_completion(srv: Server, req: ChatCompletionRequest, request: Request):
    lora = srv.check_model(req.model)
    plan = plan_chat(srv, req)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    [stream] = await srv.submit(request, [plan.ids], [plan.params], [rid], req.user, plan.names, lora=lora)
    created = int(time.time())
    if req.stream:
        return StreamingResponse(srv.watched(_chat_stream(srv, stream, rid, created, req, plan.make_parser,
                                                          len(plan.ids)), [stream]), media_type="text/event-stream")
    out = (await srv.collect(request, [stream]))[0]
    return fmt.chat_response(srv, out, rid, created, plan.make_parser, req)


def chat_text(srv: Server, messages, add_generation_prompt: bool, variables: Optional[dict] = None) -> str:
    variables = variables or {}
    template = None
    if srv.tool_template is not None and (variables.get("tools") or any(
            m.role == "tool" or m.tool_calls or m.function_call for m in messages)):
        template = srv.tool_template
    try:
        return srv.processor.render_chat([m.for_template() for m in messages], add_generation_prompt, template,
                                         **variables)
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), param="messages") from None


def template_variables(req) -> dict:
    """The chat template's context beyond the messages: the tools (OpenAI's form, as transformers passes them)
    and the request's chat_template_kwargs."""
    variables = dict(req.chat_template_kwargs or {})
    taken = sorted(set(variables) & {"messages", "add_generation_prompt", "tools"})
    if taken:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(taken)} (the request's own fields)",
                       param="chat_template_kwargs")
    if req.tools:
        variables["tools"] = [t.model_dump(exclude_none=True) for t in req.tools]
    return variables


def _left_open(rendered: str, final: str) -> str:
    """The conversation cut right after the final message's text (transformers' continue_final_message), so the
    answer continues it instead of starting a new turn."""
    for needle in (final, final.strip()):
        if needle and needle in rendered:
            return rendered[:rendered.rindex(needle) + len(needle)]
    raise APIError(400, "continue_final_message: the last message's text does not appear in the rendered "
                   "conversation (the template changed it, or it is empty)", param="messages")


def _echo_text(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's text when it is the assistant's (the one being continued)."""
    last = req.messages[-1]
    return last.text() if req.echo and last.role == "assistant" else ""


def _tool_constraint(srv: Server, req: ChatCompletionRequest, choice: str) -> tuple[Optional[dict], Optional[str]]:
    """tool_choice required / a named function: the answer is forced into calls by a JSON schema. tool_choice auto
    with a response_format: calls in the parser's form, or a text answer in the format (OpenAI applies the format
    to the text answer only)."""
    if choice == "auto" and req.structured()[1] in ("response_format", "response_format.json_schema"):
        return {"grammar": calls_or_answer(srv.tool_parser, req, srv.strict_json_schemas)}, "response_format"
    if choice == "named":
        fn = next(t.function for t in req.tools if t.function.name == req.tool_choice.function.name)
        return {"json": fn.parameters or {"type": "object"}, "disable_any_whitespace": True}, "tool_choice"
    if choice == "required":
        tools = [{"name": t.function.name, "parameters": t.function.parameters} for t in req.tools]
        return {"json": forced_calls_schema(tools, req.parallel_tool_calls), "disable_any_whitespace": True}, "tools"
    return None, None


def calls_or_answer(parser: str, req: ChatCompletionRequest, strict: bool) -> str:
    """A Lark grammar: the answer in the response format, or one or more tool calls as `parser` reads them."""
    fmt, _ = req.structured()
    answer = fmt.get("json") if "json" in fmt else {"type": "object"}
    if strict:
        answer = strict_schema(answer)
    key = "parameters" if parser == "llama3_json" else "arguments"
    call = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                        key: t.function.parameters or {"type": "object"}},
                       "required": ["name", key], "additionalProperties": False} for t in req.tools]}
    if strict:
        call = strict_schema(call)

    def js(schema) -> str:
        return "%json" + json.dumps({**schema, "x-guidance": JSON_WHITESPACE} if isinstance(schema, dict) else schema)

    if parser == "hermes":
        calls = 'calls: call ("\\n" call)*\ncall: "<tool_call>\\n" ' + js(call) + ' "\\n</tool_call>"'
    else:
        calls = 'calls: ' + js(call) + ' ("; " ' + js(call) + ')*'
    many = "calls" if req.parallel_tool_calls else "call1"
    if not req.parallel_tool_calls:
        calls += "\ncall1: " + ('call' if parser == "hermes" else js(call))
    return f"start: answer | {many}\nanswer: {js(answer)}\n{calls}\n"


def _reasoning_closed(prompt: str) -> bool:
    """The template already closed the reasoning part (Qwen3 with enable_thinking=false ends the prompt with an
    empty <think></think>): the answer is all content."""
    tail = prompt[-64:]
    return THINK_END in tail and tail.rfind(THINK_END) > tail.rfind(THINK_START)


def _parser_factory(srv: Server, req: ChatCompletionRequest, choice: str,
                    reasoning_closed: bool) -> Callable[[], ChatOutputParser]:
    """A new parser per choice of the answer."""
    def make() -> ChatOutputParser:
        if choice == "named":
            tools = ForcedCallParser(req.tool_choice.function.name)
        elif choice == "required":
            tools = ForcedCallParser()
        elif choice == "auto":
            tools = BareJsonCalls(make_tool_parser(srv.tool_parser), [t.function.name for t in req.tools])
        else:
            tools = None
        functions = ({t.function.name: t.function.model_dump() for t in req.tools} if choice == "auto" else None)
        return ChatOutputParser(srv.reasoning_parser, tools, reasoning_closed, _echo_text(req), functions,
                                req.parallel_tool_calls)
    return make


async def _chat_stream(srv: Server, stream: RequestStream, rid, created, req, make_parser, prompt_len: int):
    include_usage, continuous = usage_flags(req)
    sent_role = [False] * req.n
    parsers = [make_parser() for _ in range(req.n)]
    ended: set[int] = set()  # a choice that finished early reappears, finished, in later outputs: end it once
    final = None
    async for _, out in srv.outputs([stream]):
        usage = fmt.running_usage(prompt_len, out.num_output_tokens) if continuous else None
        for o in out.outputs:
            if o.index in ended:
                continue
            if o.finish_reason is not None:
                ended.add(o.index)
            for chunk in fmt.chat_chunks(srv, rid, created, o, parsers[o.index], not sent_role[o.index], req, usage,
                                         out.prompt_token_ids):
                sent_role[o.index] = True
                yield sse(chunk)
        final = out
    if include_usage and final is not None:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": srv.model_name,
                   "system_fingerprint": None, "choices": [], "usage": final.usage})
    yield DONE
