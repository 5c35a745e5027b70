"""The FastAPI application: routes, error mapping, request logging."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rtp_llm.engine.client import EngineClient, RequestStream
from rtp_llm.engine.outputs import RequestOutput
from rtp_llm.errors import ChatTemplateError, EngineDeadError, QueueFullError, RequestRejected
from rtp_llm.sampling import SamplingParams
from rtp_llm.server import openai_format as fmt
from rtp_llm.server.metrics import Metrics
from rtp_llm.server.middleware import AuthMiddleware, BodyLimitMiddleware
from rtp_llm.server.chat_parsing import ChatOutputParser
from rtp_llm.server.protocol import (BadText, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                     FieldRule, NativeRequest, TokenizeRequest, error_body)
from rtp_llm.tokenizer.reasoning_parser import THINK_END, THINK_START, ReasoningParser
from rtp_llm.tokenizer.tool_parsers import ForcedCallParser, detect_tool_parser, forced_calls_schema, make_tool_parser

log = logging.getLogger("rtp_llm.server")


class ClientGone(Exception):
    """A non-streaming client disconnected before its answer: a normal event, its requests are aborted."""


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
                 code: Any = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def _error(status: int, message: str, type_="invalid_request_error", param=None, code=None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status)


_OPENAI_ROUTE_ENDS = {"completions", "models", "embeddings", "responses"}


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@dataclass
class ChatOptions:
    """Chat behaviour set at startup: --chat_template (text), --tool_call_parser (auto = from the template),
    --reasoning_parser."""
    chat_template: Optional[str] = None
    tool_call_parser: str = "auto"
    reasoning_parser: Optional[str] = None


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
                 stream_stall_timeout: float = 120.0):
        self.engine = engine
        self.stream_stall_timeout = stream_stall_timeout
        self.model_name = served_model_name
        self.max_model_len = engine.max_model_len
        self.tokenizer = engine.tokenizer
        chat = chat or ChatOptions()
        if chat.chat_template is not None:
            self.tokenizer.chat_template = chat.chat_template
        self.tool_parser = (detect_tool_parser(self.tokenizer.chat_template) if chat.tool_call_parser == "auto"
                            else None if chat.tool_call_parser == "none" else chat.tool_call_parser)
        if self.tool_parser is not None:
            make_tool_parser(self.tool_parser)  # an unknown name fails at startup
        if chat.reasoning_parser is not None:
            ReasoningParser(chat.reasoning_parser)
        self.reasoning_parser = chat.reasoning_parser
        self.think_end_ids = (self.tokenizer.encode(THINK_END, add_special_tokens=False)
                              if self.reasoning_parser else [])
        self.metrics = Metrics(engine, served_model_name)
        self.users: dict[str, str] = {}  # request id -> the request's `user`, until it finishes or is closed

    # --- shared plumbing -----------------------------------------------------------------------------
    def check_model(self, name: Optional[str]) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    async def submit(self, prompt, params: SamplingParams, rid: str, user: Optional[str] = None,
                     names: Optional[dict[str, str]] = None) -> RequestStream:
        """names: the route's spelling of a SamplingParams field, for errors (chat says top_logprobs)."""
        try:
            stream = await self.engine.submit(prompt, params, rid)
            if user is not None:
                self.users[rid] = user
            return stream
        except RequestRejected as exc:
            param, message = exc.param or "prompt", str(exc)
            if names and param in names:
                message = message.replace(f"{param}:", f"{names[param]}:", 1)
                param = names[param]
            raise APIError(400, message, param=param) from None
        except QueueFullError as exc:
            raise APIError(503, str(exc), "server_overloaded", code="queue_full") from None
        except EngineDeadError as exc:
            raise APIError(503, str(exc), "server_error", code="engine_unavailable") from None

    async def watched(self, gen, streams: list[RequestStream]):
        """A response stream that ends with an error event if the engine dies, and whose requests are aborted when
        the client accepts nothing for stream_stall_timeout seconds (a client that reads too slowly, or vanished
        without closing its connection): their KV blocks do not wait for max_tokens or the TCP timeout."""
        stall = self.stream_stall_timeout
        last = [time.monotonic(), False]  # when the consumer last asked for data; whether it is waiting on us

        async def watchdog():
            while True:
                await asyncio.sleep(min(1.0, stall / 4))
                if not last[1] and time.monotonic() - last[0] > stall:
                    open_ids = [st.request_id for st in streams if not st.finished]
                    if open_ids:
                        log.info("request %s: the client accepted nothing for %.0fs; aborted", ", ".join(open_ids),
                                 stall)
                    for st in streams:
                        st.close()
                    return

        dog = asyncio.create_task(watchdog()) if stall > 0 else None
        inner = _ends_with_error_event(gen)
        try:
            while True:
                last[1] = True  # inside __anext__: waiting on the engine, not on the client
                try:
                    item = await inner.__anext__()
                except StopAsyncIteration:
                    return
                last[0], last[1] = time.monotonic(), False
                yield item  # suspended here while the client does not take the data
        finally:
            if dog is not None:
                dog.cancel()
            await inner.aclose()

    def finished(self, out: RequestOutput) -> None:
        self.metrics.observe(out)
        m = out.metrics
        ttft = (m["first_token"] - m["arrival"]) if m.get("first_token") else float("nan")
        dur = (m["finish"] - m["arrival"]) if m.get("finish") else float("nan")
        user = self.users.pop(out.request_id, None)
        log.info("request %s finished: %s, tokens in=%d (cached %d) out=%d, ttft=%.3fs, duration=%.3fs%s",
                 out.request_id, ",".join(str(o.finish_reason) for o in out.outputs), len(out.prompt_token_ids),
                 out.num_cached_tokens, sum(len(o.token_ids) for o in out.outputs), ttft, dur,
                 "" if user is None else f", user={user!r}")

    async def merged(self, streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(stream index, output) from several streams as they come; closes all on exit. The queue is bounded: a
        slow consumer leaves the outputs in each stream's mailbox, where they merge (bounded memory)."""
        q: asyncio.Queue = asyncio.Queue(maxsize=len(streams))

        async def pump(i, s):
            try:
                async for out in s:
                    await q.put((i, out))
            except asyncio.CancelledError:
                raise  # merged() is closing: nobody reads the queue any more, never wait on it
            except Exception as exc:  # noqa: BLE001 - forwarded to the consumer
                await q.put((i, exc))
            else:
                await q.put((i, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        try:
            open_streams = len(streams)
            while open_streams:
                i, item = await q.get()
                if item is None:
                    open_streams -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    if item.finished:
                        self.finished(item)
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            for s in streams:
                s.close()
                self.users.pop(s.request_id, None)

    async def collect(self, request: Request, streams: list[RequestStream]) -> list[RequestOutput]:
        """Final outputs of non-streamed requests; a client that disconnects aborts them."""
        finals: list[Optional[RequestOutput]] = [None] * len(streams)

        async def run():
            async for i, out in self.merged(streams):
                if out.finished:
                    finals[i] = out

        task = asyncio.create_task(run())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.25)
                if not task.done() and await request.is_disconnected():
                    task.cancel()
                    raise ClientGone(", ".join(s.request_id for s in streams))
            task.result()
        finally:
            if not task.done():
                task.cancel()
            for s in streams:
                s.close()
        return finals  # type: ignore[return-value]

    # --- parameter mapping ---------------------------------------------------------------------------
    def params(self, req, max_tokens: Optional[int], logprobs: Optional[int], prompt_len: int,
               constraint: Optional[dict] = None, field: Optional[str] = None,
               prompt_logprobs: Optional[int] = None) -> SamplingParams:
        """constraint / field: an output constraint the route made (tool_choice), else the request's own.
        prompt_logprobs: what the route needs of the prompt (completions' echo with logprobs)."""
        if max_tokens is None:
            max_tokens = max(1, self.max_model_len - prompt_len)
        if constraint is None:
            constraint, field = req.structured()
        try:
            params = SamplingParams(
                max_tokens=max_tokens, min_tokens=req.min_tokens, temperature=req.temperature, top_k=req.top_k,
                top_p=req.top_p, min_p=req.min_p, repetition_penalty=req.repetition_penalty,
                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty, seed=req.seed,
                stop=req.stop_list(), stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos,
                n=req.n, logprobs=logprobs, prompt_logprobs=_most(req.prompt_logprobs, prompt_logprobs),
                logit_bias=req.logit_bias_ids(), allowed_token_ids=req.allowed_token_ids,
                bad_words=list(req.bad_words or []), structured_outputs=constraint)
            if constraint is not None:  # compiled here (and cached), so a bad schema is a 400 naming its field
                self.engine.processor.grammars.check(params.structured_outputs)
            return params
        except RequestRejected as exc:
            raise APIError(400, f"{field}: {exc}", param=field) from None
        except ValueError as exc:  # SamplingParams' messages start with the field's name
            name = str(exc).split(" ", 1)[0].rstrip(":")
            if name.startswith("structured_outputs"):
                raise APIError(400, str(exc), param=field) from None
            raise APIError(400, str(exc), param=name if name in SamplingParams.__dataclass_fields__ else None) from None


def create_app(engine: EngineClient, served_model_name: str, api_key: Optional[str] = None,
               max_body_bytes: int = 1 << 20, on_shutdown: Optional[Callable[[], None]] = None,
               chat_options: Optional[ChatOptions] = None, cors: Optional[CorsOptions] = None,
               stream_stall_timeout: float = 120.0) -> FastAPI:
    """on_shutdown runs once the server has stopped serving (after the graceful drain)."""
    srv = Server(engine, served_model_name, chat_options, stream_stall_timeout)
    max_model_len = srv.max_model_len

    @asynccontextmanager
    async def lifespan(_app):
        yield
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="rtp-llm", version="0.1.0", lifespan=lifespan)
    app.state.server = srv

    @app.exception_handler(APIError)
    async def _api_error(_, exc: APIError):
        return _error(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(ClientGone)
    async def _client_gone(_, exc: ClientGone):
        log.info("request %s: the client disconnected; aborted", exc)
        return Response(status_code=499)  # nginx's "client closed request"; no one reads it

    @app.exception_handler(RequestValidationError)
    async def _validation(_, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", []) if x != "body"]
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            return _error(400, f"the body is not valid JSON: {msg}", code="invalid_json")
        field = ".".join(loc) or None
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, BadText):
            return _error(400, str(cause), param=cause.path or None, code="invalid_text")
        if isinstance(cause, FieldRule):
            return _error(400, f"{cause.param}: {cause}", param=cause.param)
        if first.get("type") == "extra_forbidden":
            return _error(400, f"{field}: this server does not implement this field (remove it from the request)",
                          param=field, code="unsupported_parameter")
        return _error(400, f"{field or 'body'}: {msg}", param=field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = str(exc.detail)
        path = request.url.path
        if exc.status_code == 404:
            message = f"no route {request.method} {path}"
            if not path.startswith("/v1/") and path.rstrip("/").split("/")[-1] in _OPENAI_ROUTE_ENDS:
                message += (f"; the OpenAI routes are under /v1 (POST /v1{path}): a client's base_url must end in "
                            f"/v1, e.g. {request.base_url}v1")
            else:
                message += "; routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, POST /, " \
                           "POST /tokenize, POST /detokenize, GET /health, GET /metrics"
        return _error(exc.status_code, message, "invalid_request_error" if exc.status_code < 500 else
                      "server_error", code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def _unexpected(_, exc: Exception):
        log.exception("unhandled error")
        return _error(500, f"internal error: {type(exc).__name__}", "server_error")

    # --- plain routes --------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if engine.dead is not None:
            return _error(503, f"the engine has stopped: {engine.dead}", "server_error")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": srv.model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "rtp-llm", "max_model_len": max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(srv.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        if req.messages is not None:
            gen = True if req.add_generation_prompt is None else req.add_generation_prompt
            text = _chat_text(srv, req.messages, gen, _template_variables(req))
            # vLLM's default for messages: the template writes the special tokens, none added
            ids = srv.tokenizer.encode(text, add_special_tokens=bool(req.add_special_tokens))
        else:
            special = True if req.add_special_tokens is None else req.add_special_tokens
            ids = srv.tokenizer.encode(req.prompt, add_special_tokens=special)
        body = {"tokens": ids, "count": len(ids), "max_model_len": max_model_len}
        if req.return_token_strs:
            body["token_strs"] = [srv.tokenizer.id_to_token(i) for i in ids]
        return body

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        vocab = srv.tokenizer.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
        text = srv.tokenizer.decode(req.tokens, skip_special_tokens=False)
        return {"prompt": text, "content": text}  # content: llama.cpp's name for it

    # --- OpenAI --------------------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        srv.check_model(req.model)
        choice = req.effective_tool_choice()
        if choice == "auto" and srv.tool_parser is None:
            raise APIError(400, "tool_choice auto needs a tool call parser: start the server with --tool_call_parser "
                           "(hermes or llama3_json; this model's chat template does not say which), or use "
                           "tool_choice required or a named function", param="tool_choice")
        text = _chat_text(srv, req.messages, req.add_generation_prompt, _template_variables(req))
        if req.continue_final_message:
            text = _left_open(text, req.messages[-1].text())
        ids = srv.tokenizer.encode(text, add_special_tokens=False)  # the template writes the special tokens
        constraint, field = _tool_constraint(req, choice)
        max_tokens = req.max_completion_tokens or req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = srv.params(req, max_tokens, logprobs, len(ids), constraint, field)
        closed = _reasoning_closed(text)
        if params.structured_outputs is not None and srv.reasoning_parser and not closed:
            params.structured_outputs.after_token_ids = tuple(srv.think_end_ids)  # constrain the answer only
        parser = _parser_factory(srv, req, choice, closed)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        stream = await srv.submit(ids, params, rid, req.user, names={"logprobs": "top_logprobs"})
        created = int(time.time())
        if req.stream:
            return StreamingResponse(srv.watched(_chat_stream(srv, stream, rid, created, req, parser, len(ids)),
                                                 [stream]), media_type="text/event-stream")
        out = (await srv.collect(request, [stream]))[0]
        return fmt.chat_response(srv, out, rid, created, parser, req)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        srv.check_model(req.model)
        prompts = req.prompts()
        encoded = [engine.processor.encode(p) for p in prompts]  # validated against the model on submit
        echo_lps = req.logprobs if req.echo else None  # the prompt's logprobs come first in the answer
        params = [srv.params(req, req.max_tokens, req.logprobs, len(ids), prompt_logprobs=echo_lps) for ids in encoded]
        rid = f"cmpl-{uuid.uuid4().hex}"
        streams = []
        try:
            for i, (ids, p) in enumerate(zip(encoded, params)):
                streams.append(await srv.submit(ids, p, f"{rid}-{i}", req.user))
        except APIError:
            for s in streams:
                s.close()
                srv.users.pop(s.request_id, None)
            raise
        created = int(time.time())
        if req.stream:
            return StreamingResponse(srv.watched(
                _completion_stream(srv, streams, rid, created, req, prompts, [len(x) for x in encoded]), streams),
                media_type="text/event-stream")
        outs = await srv.collect(request, streams)
        return fmt.completion_response(srv, outs, rid, created, req, prompts)

    # --- RTP-LLM native ------------------------------------------------------------------------------
    @app.post("/", openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/NativeRequest"}}}}})
    async def native(request: Request):
        # Parsed by hand: upstream clients often post JSON without a JSON content-type.
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
        try:
            req = NativeRequest.model_validate(body)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        gc = req.generate_config
        try:
            params = SamplingParams(
                max_tokens=gc.max_new_tokens, min_tokens=min(gc.min_new_tokens, gc.max_new_tokens),
                temperature=gc.temperature, top_k=gc.top_k, top_p=gc.top_p, min_p=gc.min_p,
                repetition_penalty=gc.repetition_penalty, presence_penalty=gc.presence_penalty,
                frequency_penalty=gc.frequency_penalty, seed=gc.random_seed, stop=gc.stop_words_str,
                stop_token_ids=[x[0] for x in gc.stop_words_list], n=gc.num_return_sequences,
                ignore_eos=gc.ignore_eos, timeout_ms=gc.timeout_ms)
        except ValueError as exc:  # SamplingParams' messages start with the field's name
            name = str(exc).split(" ", 1)[0]
            raise APIError(400, str(exc), param=name if name in SamplingParams.__dataclass_fields__ else None) from None
        rid = f"native-{uuid.uuid4().hex}"
        stream = await srv.submit(req.prompt, params, rid)
        t0 = time.monotonic()
        if req.yield_generator:
            return StreamingResponse(srv.watched(_native_stream(srv, stream, t0, gc.return_incremental), [stream]),
                                     media_type="text/event-stream")
        out = (await srv.collect(request, [stream]))[0]
        return fmt.native_response(out, t0, incremental=False)

    def openapi():
        # The native route parses its body by hand; publish its schemas beside FastAPI's own.
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            native_schema = NativeRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            comps = doc.setdefault("components", {}).setdefault("schemas", {})
            comps.update(native_schema.pop("$defs", {}))
            comps["NativeRequest"] = native_schema
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi

    if api_key:
        app.add_middleware(AuthMiddleware, api_key=api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    if cors is not None and cors.allowed_origins:  # outermost: a preflight is answered before auth
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=cors.allowed_origins, allow_methods=cors.allowed_methods,
                           allow_headers=cors.allowed_headers, allow_credentials=cors.allow_credentials)
    return app


def _chat_text(srv: Server, messages, add_generation_prompt: bool, variables: Optional[dict] = None) -> str:
    try:
        return srv.engine.processor.render_chat([m.for_template() for m in messages], add_generation_prompt,
                                                **(variables or {}))
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), param="messages") from None


def _chat_prompt(srv: Server, messages, add_generation_prompt: bool, variables: Optional[dict] = None) -> list[int]:
    return srv.tokenizer.encode(_chat_text(srv, messages, add_generation_prompt, variables), add_special_tokens=False)


def _template_variables(req) -> dict:
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


def _most(a: Optional[int], b: Optional[int]) -> Optional[int]:
    """The larger of two top-logprob counts (-1: all; None: not asked)."""
    if a is None or b is None:
        return b if a is None else a
    return -1 if -1 in (a, b) else max(a, b)


def _echo_text(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's text when it is the assistant's (the one being continued)."""
    last = req.messages[-1]
    return last.text() if req.echo and last.role == "assistant" else ""


def _tool_constraint(req: ChatCompletionRequest, choice: str) -> tuple[Optional[dict], Optional[str]]:
    """tool_choice required / a named function: the answer is forced into calls by a JSON schema."""
    if choice == "named":
        fn = next(t.function for t in req.tools if t.function.name == req.tool_choice.function.name)
        return {"json": fn.parameters or {"type": "object"}, "disable_any_whitespace": True}, "tool_choice"
    if choice == "required":
        tools = [{"name": t.function.name, "parameters": t.function.parameters} for t in req.tools]
        return {"json": forced_calls_schema(tools, req.parallel_tool_calls), "disable_any_whitespace": True}, "tools"
    return None, None


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
            tools = make_tool_parser(srv.tool_parser)
        else:
            tools = None
        functions = ({t.function.name: t.function.model_dump() for t in req.tools} if choice == "auto" else None)
        return ChatOutputParser(srv.reasoning_parser, tools, reasoning_closed, _echo_text(req), functions,
                                req.parallel_tool_calls)
    return make


async def _ends_with_error_event(gen):
    """An engine that dies mid-stream (e.g. a tensor-parallel worker was lost) ends the stream with an
    OpenAI-style error event, which clients raise as an error, instead of a dropped connection."""
    try:
        async for item in gen:
            yield item
    except EngineDeadError as exc:
        yield _sse(error_body(str(exc), "server_error", None, "engine_unavailable"))


def _usage_flags(req) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of a streamed request."""
    so = req.stream_options
    return bool(so and so.include_usage), bool(so and so.continuous_usage_stats)


async def _chat_stream(srv: Server, stream: RequestStream, rid, created, req, make_parser, prompt_len: int):
    n = req.n
    include_usage, continuous = _usage_flags(req)
    sent_role = [False] * n
    parsers = [make_parser() for _ in range(n)]
    ended: set[int] = set()  # a choice that finished early reappears, finished, in later outputs: end it once
    final = None
    async for _, out in srv.merged([stream]):
        usage = fmt.running_usage(prompt_len, sum(len(o.token_ids) for o in out.outputs)) if continuous else None
        for o in out.outputs:
            if o.index in ended:
                continue
            if o.finish_reason is not None:
                ended.add(o.index)
            for chunk in fmt.chat_chunks(srv, rid, created, o, parsers[o.index], not sent_role[o.index], req, usage,
                                         out.prompt_token_ids):
                sent_role[o.index] = True
                yield _sse(chunk)
        final = out
    if include_usage and final is not None:
        yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": srv.model_name,
                    "system_fingerprint": None, "choices": [], "usage": final.usage})
    yield "data: [DONE]\n\n"


async def _completion_stream(srv: Server, streams, rid, created, req, prompts: list, prompt_lens: list[int]):
    include_usage, continuous = _usage_flags(req)
    finals = {}
    produced = [0] * len(streams)
    ended: set[int] = set()  # a choice that finished early reappears, finished, in later outputs: end it once
    announced: set[int] = set()
    async for i, out in srv.merged(streams):
        produced[i] = sum(len(o.token_ids) for o in out.outputs)
        usage = fmt.running_usage(sum(prompt_lens), sum(produced)) if continuous else None
        for o in out.outputs:
            index = i * req.n + o.index
            if index in ended:
                continue
            if o.finish_reason is not None:
                ended.add(index)
            prompt_ids = None if index in announced else out.prompt_token_ids
            echo = (fmt.echo_text(srv, prompts[i]), out) if req.echo and index not in announced else None
            chunk = fmt.completion_chunk(srv, rid, created, index, o, req, usage, prompt_ids, echo)
            if chunk is not None:
                announced.add(index)
                yield _sse(chunk)
        if out.finished:
            finals[i] = out
    if include_usage:
        yield _sse({"id": rid, "object": "text_completion", "created": created, "model": srv.model_name,
                    "system_fingerprint": None, "choices": [], "usage": fmt.sum_usage(finals.values())})
    yield "data: [DONE]\n\n"


async def _native_stream(srv: Server, stream: RequestStream, t0: float, incremental: bool):
    async for _, out in srv.merged([stream]):
        yield _sse(fmt.native_response(out, t0, incremental))
