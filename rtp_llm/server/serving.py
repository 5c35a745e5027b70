"""What every route shares: the served model, its tokenizer and chat options, submitting requests (an engine
refusal becomes an APIError), the finished-request log and metrics, and request fields -> SamplingParams."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from fastapi import Request

from rtp_llm.engine.client import EngineClient, RequestStream
from rtp_llm.engine.outputs import RequestOutput
from rtp_llm.errors import EngineDeadError, RequestRejected
from rtp_llm.lora.adapter import LoRARequest
from rtp_llm.pooling import PoolingParams
from rtp_llm.sampling import SamplingParams
from rtp_llm.server import streams as st
from rtp_llm.server.http_errors import APIError
from rtp_llm.server.metrics import Metrics
from rtp_llm.server.response_store import ResponseStore
from rtp_llm.server.serving_lora import LoRAOptions, LoRARegistry
from rtp_llm.tokenizer.reasoning_parser import THINK_END, ReasoningParser
from rtp_llm.tokenizer.tool_parsers import detect_tool_parser, fallback_tool_template, make_tool_parser

log = logging.getLogger("rtp_llm.server")


@dataclass
class ChatOptions:
    """Chat behaviour set at startup: --chat_template (text), --tool_call_parser (auto = from the template),
    --reasoning_parser, --strict_json_schemas (tool parameters and response formats)."""
    chat_template: Optional[str] = None
    tool_call_parser: str = "auto"
    reasoning_parser: Optional[str] = None
    strict_json_schemas: bool = True


@dataclass
class CorsOptions:
    """vLLM's --allowed_origins / --allowed_methods / --allowed_headers / --allow_credentials; no origins = no
    CORS headers at all."""
    allowed_origins: list = field(default_factory=list)
    allowed_methods: list = field(default_factory=lambda: ["*"])
    allowed_headers: list = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


class Server:
    def __init__(self, engine: EngineClient, served_model_name: str, chat: Optional[ChatOptions] = None,
                 stream_stall_timeout: float = 120.0, lora: Optional[LoRAOptions] = None):
        self.engine = engine
        self.processor = engine.processor
        self.stream_stall_timeout = stream_stall_timeout
        self.model_name = served_model_name
        self.max_model_len = engine.max_model_len
        self.tokenizer = engine.tokenizer
        chat = chat or ChatOptions()
        if chat.chat_template is not None:
            self.tokenizer.chat_template = chat.chat_template
        self.tool_parser = (detect_tool_parser(self.tokenizer.chat_template) if chat.tool_call_parser == "auto"
                            else None if chat.tool_call_parser == "none" else chat.tool_call_parser)
        # A template that cannot show tools: requests with tools use the family's tool template (with --chat_template
        # or an explicit parser, the user decides).
        self.tool_template = None
        if chat.tool_call_parser == "auto" and chat.chat_template is None and self.tool_parser is None \
                and "generate" in self.processor.limits.tasks:
            found = fallback_tool_template(self.tokenizer.chat_template)
            if found is not None:
                name, self.tool_template, self.tool_parser = found
                log.info("the chat template cannot show tools: requests with tools use rtp-llm's %s template and "
                         "the %s tool call parser (--chat_template or --tool_call_parser to choose)", name,
                         self.tool_parser)
        if self.tool_parser is not None:
            make_tool_parser(self.tool_parser)  # an unknown name fails at startup
        if chat.reasoning_parser is not None:
            ReasoningParser(chat.reasoning_parser)
        self.reasoning_parser = chat.reasoning_parser
        self.strict_json_schemas = chat.strict_json_schemas
        self.think_end_ids = (self.tokenizer.encode(THINK_END, add_special_tokens=False)
                              if self.reasoning_parser else [])
        self.metrics = Metrics(engine, served_model_name)
        self.users: dict[str, str] = {}  # request id -> the request's `user`, until it finishes or is closed
        self.responses = ResponseStore()  # /v1/responses with store=true
        self.loras = LoRARegistry(lora or LoRAOptions())

    def check_model(self, name: Optional[str]) -> Optional[LoRARequest]:
        """The LoRA adapter a request's `model` names (None: the base model); 404 for any other name."""
        if name is None or name == self.model_name:
            return None
        lora = self.loras.resolve(name)
        if lora is None:
            served = ", ".join(repr(n) for n in [self.model_name, *self.loras.adapters])
            raise APIError(404, f"the model {name!r} does not exist; this server serves {served}", param="model",
                           code="model_not_found")
        return lora

    async def submit(self, request: Request, prompts: list, params: list, rids: list[str],
                     user: Optional[str] = None, names: Optional[dict[str, str]] = None,
                     pooling: Optional[PoolingParams] = None,
                     lora: Optional[LoRARequest] = None) -> list[RequestStream]:
        """Sends the requests and waits until each has started (or was refused: all are then closed and the
        APIError raised). names: the route's spelling of a SamplingParams field, for errors; pooling: the pooling
        requests' params (params then None each)."""
        streams: list[RequestStream] = []
        try:
            for prompt, p, rid in zip(prompts, params, rids):
                streams.append(self.engine.submit(prompt, p, rid, pooling, lora))
        except (RequestRejected, EngineDeadError) as exc:
            for s in streams:
                s.close()
            raise APIError.from_engine(exc, names) from None
        if user is not None:
            for s in streams:
                self.users[s.request_id] = user
        try:
            await st.started(request, streams, names)
        except BaseException:
            for s in streams:
                self.users.pop(s.request_id, None)
            raise
        return streams

    def finished(self, out: RequestOutput) -> None:
        self.metrics.observe(out)
        m = out.metrics
        ttft = (m["first_token"] - m["arrival"]) if m.get("first_token") else float("nan")
        dur = (m["finish"] - m["arrival"]) if m.get("finish") else float("nan")
        user = self.users.pop(out.request_id, None)
        log.info("request %s finished: %s, tokens in=%d (cached %d) out=%d, ttft=%.3fs, duration=%.3fs%s",
                 out.request_id, ",".join(str(o.finish_reason) for o in out.outputs), len(out.prompt_token_ids),
                 out.num_cached_tokens, out.num_output_tokens, ttft, dur, "" if user is None else f", user={user!r}")

    def outputs(self, streams: list[RequestStream]):
        return st.outputs(streams, self.finished)

    async def collect(self, request: Request, streams: list[RequestStream]) -> list[RequestOutput]:
        try:
            return await st.collect(request, streams, self.finished)
        finally:
            for s in streams:
                self.users.pop(s.request_id, None)

    def watched(self, gen, streams: list[RequestStream]):
        return st.watched(gen, streams, self.stream_stall_timeout)

    def params(self, req, max_tokens: Optional[int], logprobs: Optional[int], prompt_len: int,
               constraint: Optional[dict] = None, field: Optional[str] = None,
               prompt_logprobs: Optional[int] = None) -> SamplingParams:
        """An OpenAI request's SamplingParams. constraint / field: an output constraint the route made
        (tool_choice), else the request's own; prompt_logprobs: what the route needs of the prompt (completions'
        echo with logprobs). The input processor checks the rest (a bad grammar is a 400 naming `field`)."""
        if max_tokens is None:
            max_tokens = max(1, self.max_model_len - prompt_len)
        if constraint is None:
            constraint, field = req.structured()
        if constraint is not None and "json" in constraint:
            constraint = {**constraint, "strict": self.strict_json_schemas}
        try:
            params = SamplingParams(
                max_tokens=max_tokens, min_tokens=req.min_tokens, temperature=req.temperature, top_k=req.top_k,
                top_p=req.top_p, min_p=req.min_p, repetition_penalty=req.repetition_penalty,
                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty, seed=req.seed,
                stop=req.stop_list(), stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos,
                n=req.n, logprobs=logprobs, prompt_logprobs=_most(req.prompt_logprobs, prompt_logprobs),
                logit_bias=req.logit_bias_ids(), allowed_token_ids=req.allowed_token_ids,
                bad_words=list(req.bad_words or []), structured_outputs=constraint)
        except ValueError as exc:
            raise param_error(exc, field) from None
        return params


def param_error(exc: ValueError, field: Optional[str] = None) -> APIError:
    """SamplingParams' ValueErrors start with the field's name."""
    name = str(exc).split(" ", 1)[0].rstrip(":")
    if name.startswith("structured_outputs"):
        return APIError(400, str(exc), param=field)
    return APIError(400, str(exc), param=name if name in SamplingParams.__dataclass_fields__ else None)


def _most(a: Optional[int], b: Optional[int]) -> Optional[int]:
    """The larger of two top-logprob counts (-1: all; None: not asked)."""
    if a is None or b is None:
        return b if a is None else a
    return -1 if -1 in (a, b) else max(a, b)
