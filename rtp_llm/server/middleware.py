"""ASGI middleware: bearer-token auth and a request-body size limit, both answering with
OpenAI-style error bodies."""

from __future__ import annotations

import hmac
import json
import logging

from rtp_llm.server.protocol_base import error_body

log = logging.getLogger("rtp_llm.server")


async def _send_json(send, status: int, body: dict, headers=(), scope=None) -> None:
    if scope is not None:  # a refusal: one log line with the reason
        log.info("rejected %s %s: %d %s", scope.get("method"), scope.get("path"), status, body["error"]["message"])
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


class AuthMiddleware:
    """Requires `Authorization: Bearer <api_key>` on every route except /health and /metrics (probes and Prometheus
    scrapers; neither says anything about prompts), and on no CORS preflight (an OPTIONS request: browsers never
    send credentials on it). The key is compared in constant time."""

    OPEN_PATHS = ("/health", "/metrics")

    def __init__(self, app, api_key: str):
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.OPEN_PATHS and scope["method"] != "OPTIONS":
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(auth, b"Bearer " + self.key):
                await _send_json(send, 401, error_body("invalid or missing API key", "authentication_error",
                                                       code="invalid_api_key"),
                                 [(b"www-authenticate", b"Bearer")], scope)
                return
        await self.app(scope, receive, send)


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Refuses bodies over max_bytes with 413, by Content-Length or while reading a chunked body."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        too_large = error_body(f"request body is larger than {self.max} bytes", code="request_too_large")
        if length is not None and length.isdigit() and int(length) > self.max:
            return await _send_json(send, 413, too_large, scope=scope)
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max:
                    raise _TooLarge
            return msg

        async def tracking_send(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _send_json(send, 413, too_large, scope=scope)
