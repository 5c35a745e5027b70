"""POST /: RTP-LLM's native route (prompt + generate_config), whole or streamed (yield_generator)."""

from __future__ import annotations

import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from rtp_llm.sampling import SamplingParams
from rtp_llm.server import openai_format as fmt
from rtp_llm.server.http_errors import APIError
from rtp_llm.server.protocol_native import NativeRequest
from rtp_llm.server.serving import Server, param_error
from rtp_llm.server.streams import sse

# The route parses its body by hand, so FastAPI does not know its schema: published by publish_native_schema.
OPENAPI_EXTRA = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/NativeRequest"}}}}}


async def generate(srv: Server, request: Request):
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
    except ValueError as exc:
        raise param_error(exc) from None
    [stream] = await srv.submit(request, [req.prompt], [params], [f"native-{uuid.uuid4().hex}"])
    t0 = time.monotonic()
    if req.yield_generator:
        return StreamingResponse(srv.watched(_native_stream(srv, stream, t0, gc.return_incremental), [stream]),
                                 media_type="text/event-stream")
    out = (await srv.collect(request, [stream]))[0]
    return fmt.native_response(out, t0, incremental=False)


async def _native_stream(srv: Server, stream, t0: float, incremental: bool):
    async for _, out in srv.outputs([stream]):
        yield sse(fmt.native_response(out, t0, incremental))


def publish_native_schema(app: FastAPI) -> None:
    """The OpenAPI document with NativeRequest's schemas beside FastAPI's own."""
    def openapi():
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
