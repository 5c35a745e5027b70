"""The FastAPI application: thin routes over the serving_* modules, the plain routes (health, models, metrics,
tokenize), error handlers and middleware."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from rtp_llm.engine.client import EngineClient
from rtp_llm.server import serving_native, serving_pooling, serving_responses
from rtp_llm.server.http_errors import APIError, error, install_error_handlers
from rtp_llm.server.middleware import AuthMiddleware, BodyLimitMiddleware
from rtp_llm.server.protocol_native import DetokenizeRequest, TokenizeRequest
from rtp_llm.server.protocol import ChatCompletionRequest, CompletionRequest
from rtp_llm.server.protocol_base import UnknownFields
from rtp_llm.server.protocol_pooling import ClassifyRequest, EmbeddingRequest, RerankRequest, ScoreRequest
from rtp_llm.server.protocol_responses import ResponsesRequest
from rtp_llm.server.serving import ChatOptions, CorsOptions, Server
from rtp_llm.server.serving_lora import LoadLoRARequest, LoRAOptions, UnloadLoRARequest
from rtp_llm.server.serving_chat import chat_text, create_chat_completion, template_variables
from rtp_llm.server.serving_completion import create_completion

__all__ = ["ChatOptions", "CorsOptions", "create_app"]


def create_app(engine: EngineClient, served_model_name: str, api_key: Optional[str] = None,
               max_body_bytes: int = 1 << 20, on_shutdown: Optional[Callable[[], None]] = None,
               chat_options: Optional[ChatOptions] = None, cors: Optional[CorsOptions] = None,
               stream_stall_timeout: float = 120.0, unknown_fields: str = "reject",
               lora: Optional[LoRAOptions] = None) -> FastAPI:
    """on_shutdown runs once the server has stopped serving (after the graceful drain); unknown_fields: reject | ignore
    (--unknown_fields)."""
    UnknownFields.ignore = unknown_fields == "ignore"
    srv = Server(engine, served_model_name, chat_options, stream_stall_timeout, lora)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="rtp-llm", version="0.1.0", lifespan=lifespan)
    app.state.server = srv
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        if engine.dead is not None:
            return error(503, f"the engine has stopped: {engine.dead}", "server_error")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        now = int(time.time())
        base = {"id": srv.model_name, "object": "model", "created": now, "owned_by": "rtp-llm", "root": srv.model_name,
                "parent": None, "max_model_len": srv.max_model_len}
        adapters = [{**base, "id": name, "root": adapter.lora_path, "parent": srv.model_name}
                    for name, adapter in srv.loras.adapters.items()]
        return {"object": "list", "data": [base, *adapters]}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(srv.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        srv.check_model(req.model)
        if req.messages is not None:
            gen = True if req.add_generation_prompt is None else req.add_generation_prompt
            text = chat_text(srv, req.messages, gen, template_variables(req))
            # vLLM's default for messages: the template writes the special tokens, none added
            ids = srv.tokenizer.encode(text, add_special_tokens=bool(req.add_special_tokens))
        else:
            special = True if req.add_special_tokens is None else req.add_special_tokens
            ids = srv.tokenizer.encode(req.prompt, add_special_tokens=special)
        body = {"tokens": ids, "count": len(ids), "max_model_len": srv.max_model_len}
        if req.return_token_strs:
            body["token_strs"] = [srv.tokenizer.id_to_token(i) for i in ids]
        return body

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        srv.check_model(req.model)
        vocab = srv.tokenizer.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
        text = srv.tokenizer.decode(req.tokens, skip_special_tokens=False)
        return {"prompt": text, "content": text}  # content: llama.cpp's name for it

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        return await create_chat_completion(srv, req, request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await create_completion(srv, req, request)

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request):
        return await serving_responses.create_response(srv, req, request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return serving_responses.get_response(srv, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return serving_responses.delete_response(srv, response_id)

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request):
        return await serving_pooling.create_embedding(srv, req, request)

    @app.post("/v1/score")
    @app.post("/score")
    async def score(req: ScoreRequest, request: Request):
        return await serving_pooling.create_score(srv, req, request)

    @app.post("/classify")
    @app.post("/v1/classify")
    async def classify(req: ClassifyRequest, request: Request):
        return await serving_pooling.create_classification(srv, req, request)

    @app.post("/v1/rerank")
    @app.post("/rerank")
    @app.post("/v2/rerank")
    async def rerank(req: RerankRequest, request: Request):
        return await serving_pooling.create_rerank(srv, req, request)

    if lora is not None and lora.runtime_updates:  # vLLM serves these only when asked to
        @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
        async def load_lora_adapter(req: LoadLoRARequest):
            return srv.loras.load(req, srv.model_name)

        @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
        async def unload_lora_adapter(req: UnloadLoRARequest):
            return srv.loras.unload(req, engine)

    @app.post("/", openapi_extra=serving_native.OPENAPI_EXTRA)
    async def native(request: Request):
        return await serving_native.generate(srv, request)

    serving_native.publish_native_schema(app)
    if api_key:
        app.add_middleware(AuthMiddleware, api_key=api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    if cors is not None and cors.allowed_origins:  # outermost: a preflight is answered before auth
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=cors.allowed_origins, allow_methods=cors.allowed_methods,
                           allow_headers=cors.allowed_headers, allow_credentials=cors.allow_credentials)
    return app
