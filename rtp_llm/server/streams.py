"""From request streams to HTTP: waiting for a request's start (its refusal becomes a 4xx/503 before a status is
sent), iterating one or several streams, collecting final outputs, and SSE framing with the stall watchdog."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import Request

from rtp_llm.engine.client import RequestStream
from rtp_llm.engine.outputs import RequestOutput
from rtp_llm.errors import EngineDeadError
from rtp_llm.server.http_errors import APIError, ClientGone
from rtp_llm.server.protocol_base import error_body

log = logging.getLogger("rtp_llm.server")

DONE = "data: [DONE]\n\n"


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _until_done_or_gone(request: Request, task: asyncio.Task, streams: list[RequestStream]) -> None:
    """Waits for task; a client that disconnects meanwhile cancels it and aborts the streams (ClientGone)."""
    while not task.done():
        await asyncio.wait({task}, timeout=0.25)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            for s in streams:
                s.close()
            raise ClientGone(", ".join(s.request_id for s in streams))


async def started(request: Request, streams: list[RequestStream], names: Optional[dict[str, str]] = None) -> None:
    """Waits until every stream has output or was refused; a refusal (queue full, id in use, the engine died)
    closes them all and raises the APIError it maps to."""
    async def wait_all():
        for s in streams:
            await s.wait_started()

    task = asyncio.ensure_future(wait_all())
    try:
        await _until_done_or_gone(request, task, streams)
        task.result()
    except (APIError, ClientGone):
        raise
    except Exception as exc:  # noqa: BLE001 - mapped, or re-raised by from_engine
        for s in streams:
            s.close()
        raise APIError.from_engine(exc, names) from None


async def outputs(streams: list[RequestStream], on_finished: Callable[[RequestOutput], None]
                  ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) as they come; closes every stream on exit. One stream is read directly; several are
    merged through a queue bounded by their count (a slow consumer leaves the news in each stream's state)."""
    try:
        if len(streams) == 1:
            async for out in streams[0]:
                if out.finished:
                    on_finished(out)
                yield 0, out
            return
        q: asyncio.Queue = asyncio.Queue(maxsize=len(streams))

        async def pump(i, s):
            try:
                async for out in s:
                    await q.put((i, out))
            except asyncio.CancelledError:
                raise  # outputs() is closing: nobody reads the queue any more, never wait on it
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
                        on_finished(item)
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
    finally:
        for s in streams:
            s.close()


async def collect(request: Request, streams: list[RequestStream],
                  on_finished: Callable[[RequestOutput], None]) -> list[RequestOutput]:
    """Final outputs of non-streamed requests; a client that disconnects aborts them (ClientGone)."""
    finals: list[Optional[RequestOutput]] = [None] * len(streams)

    async def run():
        async for i, out in outputs(streams, on_finished):
            if out.finished:
                finals[i] = out

    task = asyncio.ensure_future(run())
    try:
        await _until_done_or_gone(request, task, streams)
        task.result()
    except EngineDeadError as exc:
        raise APIError.from_engine(exc) from None
    finally:
        if not task.done():
            task.cancel()
        for s in streams:
            s.close()
    return finals  # type: ignore[return-value]


class _Consumer:
    """When the HTTP consumer last took data, and whether it is waiting on the engine (not stalled)."""
    __slots__ = ("last", "waiting")

    def __init__(self):
        self.last, self.waiting = time.monotonic(), False


async def watched(gen, streams: list[RequestStream], stall: float):
    """A response stream that ends with an error event if the engine dies, and whose requests are aborted when the
    client accepts nothing for `stall` seconds (a client that reads too slowly, or vanished without closing its
    connection): their KV blocks do not wait for max_tokens or the TCP timeout."""
    consumer = _Consumer()

    async def watchdog():
        while True:
            await asyncio.sleep(min(1.0, stall / 4))
            if not consumer.waiting and time.monotonic() - consumer.last > stall:
                open_ids = [st.request_id for st in streams if not st.finished]
                if open_ids:
                    log.info("request %s: the client accepted nothing for %.0fs; aborted", ", ".join(open_ids), stall)
                for st in streams:
                    st.close()
                return

    dog = asyncio.create_task(watchdog()) if stall > 0 else None
    inner = _ends_with_error_event(gen)
    try:
        while True:
            consumer.waiting = True  # inside __anext__: waiting on the engine, not on the client
            try:
                item = await inner.__anext__()
            except StopAsyncIteration:
                return
            consumer.last, consumer.waiting = time.monotonic(), False
            yield item  # suspended here while the client does not take the data
    finally:
        if dog is not None:
            dog.cancel()
        await inner.aclose()


async def _ends_with_error_event(gen):
    """An engine that dies mid-stream (e.g. a tensor-parallel worker was lost) ends the stream with an OpenAI-style
    error event, which clients raise as an error, instead of a dropped connection."""
    try:
        async for item in gen:
            yield item
    except EngineDeadError as exc:
        yield sse(error_body(str(exc), "server_error", None, "engine_unavailable"))


def usage_flags(req) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of a streamed request."""
    so = req.stream_options
    return bool(so and so.include_usage), bool(so and so.continuous_usage_stats)
