"""The server's errors and how each becomes an OpenAI-style error body (400 for a bad request, 404 for a bad
route or model, 503 for an overloaded or dead engine; never a bare 500 for a caller's mistake)."""

from __future__ import annotations

import logging
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from rtp_llm.errors import EngineDeadError, QueueFullError, RequestRejected
from rtp_llm.server.protocol_base import BadText, FieldRule, error_body

log = logging.getLogger("rtp_llm.server")

_OPENAI_ROUTE_ENDS = {"completions", "models", "embeddings", "responses"}
ROUTES = ("POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST /v1/embeddings, POST /v1/score, "
          "POST /v1/rerank, GET /v1/models, POST /, POST /tokenize, POST /detokenize, GET /health, GET /metrics")


class ClientGone(Exception):
    """A non-streaming client disconnected before its answer: a normal event, its requests are aborted."""


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
                 code: Any = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    @classmethod
    def from_engine(cls, exc: BaseException, names: Optional[dict[str, str]] = None) -> "APIError":
        """The engine's refusal of a request as the HTTP error it is. names: the route's spelling of a
        SamplingParams field (chat says top_logprobs)."""
        if isinstance(exc, RequestRejected):
            param, message = exc.param or "prompt", str(exc)
            if names and param in names:
                if message.startswith(f"{param}:"):
                    message = message[len(param) + 1:].lstrip()
                param = names[param]
                message = f"{param}: {message}"
            return cls(400, message, param=param)
        if isinstance(exc, QueueFullError):
            return cls(503, str(exc), "server_overloaded", code="queue_full")
        if isinstance(exc, EngineDeadError):
            return cls(503, str(exc), "server_error", code="engine_unavailable")
        raise exc


def error(status: int, message: str, type_="invalid_request_error", param=None, code=None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status)


def rejected(request: Request, status: int, message: str, type_="invalid_request_error", param=None,
             code=None) -> JSONResponse:
    """A refused request's answer, and its line in the log (the reason, never the prompt)."""
    log.info("rejected %s %s: %d %s", request.method, request.url.path, status, message[:300])
    return error(status, message, type_, param, code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return rejected(request, exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(ClientGone)
    async def _client_gone(_, exc: ClientGone):
        log.info("request %s: the client disconnected; aborted", exc)
        return Response(status_code=499)  # nginx's "client closed request"; no one reads it

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", []) if x != "body"]
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            return rejected(request, 400, f"the body is not valid JSON: {msg}", code="invalid_json")
        field = ".".join(loc) or None
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, BadText):
            return rejected(request, 400, str(cause), param=cause.path or None, code="invalid_text")
        if isinstance(cause, FieldRule):  # a nested object's rule: its path, then the field
            param = ".".join(loc + [cause.param])
            return rejected(request, 400, f"{param}: {cause}", param=param)
        if first.get("type") == "extra_forbidden":
            return rejected(request, 400, f"{field}: this server does not implement this field (remove it from the "
                            f"request, or start the server with --unknown_fields ignore)", param=field,
                            code="unsupported_parameter")
        return rejected(request, 400, f"{field or 'body'}: {msg}", param=field)

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
                message += f"; routes: {ROUTES}"
        return rejected(request, exc.status_code, message, "invalid_request_error" if exc.status_code < 500 else
                        "server_error", code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def _unexpected(_, exc: Exception):
        log.exception("unhandled error")
        return error(500, f"internal error: {type(exc).__name__}", "server_error")
