"""The asyncio face of the engine: `async for out in engine.generate(prompt, params, request_id)`.

Two engines share it (EngineFront):
- AsyncEngine: the LLMEngine on a thread of this process (the Python API, tests);
- EngineProcess (engine_process.py): the LLMEngine in a process of its own (the HTTP server), so the
  engine loop never waits for the GIL of the process that parses HTTP and formats responses.

Outputs reach each request's asyncio.Queue through loop.call_soon_threadsafe, so the event loop never
waits on model work. Cancelling the consumer (a client that disconnects) aborts the request and frees
its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from typing import AsyncIterator, Callable, Optional, Sequence, Union

from rtp_llm.engine.errors import EngineDeadError
from rtp_llm.engine.llm_engine import LLMEngine
from rtp_llm.engine.outputs import RequestOutput
from rtp_llm.sampling import SamplingParams

log = logging.getLogger(__name__)

# done(exc_or_None): how an engine answers a queued request (accepted, or the validation error)
AddCallback = Callable[[Optional[BaseException]], None]


class EngineFront:
    """Request streams over an engine that runs elsewhere (a thread, a process). Subclasses queue the
    request (_send_add), abort, shutdown, and report tokenizer, max_model_len and stats()."""

    tokenizer = None
    max_model_len: int = 0

    def __init__(self, on_death=None):
        """on_death(exc): called once if the engine dies."""
        self._on_death = on_death
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._accepting = True
        self._lock = threading.Lock()
        self.dead: Optional[BaseException] = None

    def _send_add(self, rid: str, prompt, params: SamplingParams, done: AddCallback) -> None:
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        raise NotImplementedError

    def stats(self) -> dict:
        raise NotImplementedError

    def shutdown(self, timeout: float = 5.0) -> None:
        raise NotImplementedError

    # --- delivery (any thread) -----------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Marks the engine dead (/health turns 503, new requests are refused) and ends every stream with
        the error. Callable from any thread (a tensor-parallel monitor that saw a worker die)."""
        with self._lock:
            first = self.dead is None
            if first:
                self.dead = exc
        self._on_fail(exc)
        for rid in list(self._streams):
            self._deliver(rid, exc)
        if first and self._on_death is not None:
            self._on_death(exc)

    def _on_fail(self, exc: BaseException) -> None:
        """Subclasses settle work of their own that waits on the engine."""

    def _deliver_outputs(self, outs) -> None:
        """A step's outputs in one event-loop callback per loop: one wake-up of the asyncio thread per step
        rather than one per sequence."""
        batches: dict = {}
        for out in outs:
            entry = self._streams.get(out.request_id)
            if entry is not None:
                batches.setdefault(entry[0], []).append((entry[1], out))
        for loop, items in batches.items():
            _call_soon(loop, _put_all, items)

    def _deliver(self, rid: str, item) -> None:
        entry = self._streams.get(rid)
        if entry is not None:
            loop, q = entry
            _call_soon(loop, q.put_nowait, item)

    # --- the asyncio side ----------------------------------------------------------------------------
    async def submit(self, prompt: Union[str, Sequence[int]], params: SamplingParams,
                     request_id: Optional[str] = None) -> "RequestStream":
        """Queues a request; raises the engine's validation errors (RequestRejected, QueueFullError)."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine has stopped: {self.dead}")
        if not self._accepting:
            raise EngineDeadError("the server is shutting down")
        rid = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        added: asyncio.Future = loop.create_future()

        def done(exc):
            def settle():
                if not added.done():
                    added.set_exception(exc) if exc else added.set_result(None)
            _call_soon(loop, settle)

        self._streams[rid] = (loop, q)
        self._send_add(rid, prompt, params, done)
        try:
            await added
        except BaseException:
            self._streams.pop(rid, None)
            raise
        return RequestStream(self, rid, q)

    async def generate(self, prompt: Union[str, Sequence[int]], params: SamplingParams,
                       request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        stream = await self.submit(prompt, params, request_id)
        async with stream:
            async for out in stream:
                yield out

    def stop_accepting(self) -> None:
        self._accepting = False

    @property
    def num_active(self) -> int:
        return len(self._streams)


class AsyncEngine(EngineFront):
    """The LLMEngine on its own thread of this process. Requests and aborts reach it through a command
    queue; the engine thread owns the LLMEngine."""

    def __init__(self, engine: LLMEngine, on_death=None):
        super().__init__(on_death)
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self._commands: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rtp-llm-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            self.engine.device.bind_thread()
            while not self._stop.is_set():
                self._drain_commands()
                if not self.engine.has_unfinished():
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                self._deliver_outputs(self.engine.step())
        except BaseException as exc:  # the engine itself broke: fail every stream, refuse new work
            log.exception("engine loop died")
            self.fail(exc)
        finally:
            # Closing belongs to this thread: tensor-parallel collectives must not interleave with a step.
            self.engine.close()

    def _drain_commands(self) -> None:
        while True:
            try:
                kind, args = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                rid, prompt, params, done = args
                try:
                    self.engine.add_request(rid, prompt, params)
                    done(None)
                except Exception as exc:  # validation errors go back to the caller
                    done(exc)
            elif kind == "abort":
                self.engine.abort(args)

    def _send_add(self, rid, prompt, params, done) -> None:
        self._commands.put(("add", (rid, prompt, params, done)))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wake.set()

    def stats(self) -> dict:
        return self.engine.stats()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """loop.call_soon_threadsafe, except that a loop already closed (the server is exiting while the engine
    still reports) drops the call instead of raising on the engine's or the reader's thread."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _put_all(items) -> None:
    for q, item in items:
        q.put_nowait(item)


class RequestStream:
    """Outputs of one request. Leaving it before the request finished (an exception, a cancelled
    task, a disconnected client) aborts the request and frees its KV blocks."""

    def __init__(self, engine: EngineFront, request_id: str, q: asyncio.Queue):
        self.engine, self.request_id, self._q = engine, request_id, q
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._q.get()
        if isinstance(item, BaseException):
            self.close()
            raise EngineDeadError(f"the engine has stopped: {item}")
        if item.finished:
            self.finished = True
            self.engine._streams.pop(self.request_id, None)
        return item

    def close(self) -> None:
        self.engine._streams.pop(self.request_id, None)
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
