"""EngineClient: the asyncio face of an engine that runs elsewhere, `async for out in client.generate(prompt,
params)`. One interface, two transports (as vLLM's core_client.py):
- ThreadEngineClient: the EngineCore on a thread of this process (the Python API, tests);
- ProcessEngineClient: the EngineCore in a process of its own (the HTTP server), so that the engine loop never
  waits for the GIL of the process that parses HTTP and formats responses.
Both speak the typed messages of engine/protocol.py to the same loop (engine/core_loop.py).

Requests are validated and tokenized here (the client's InputProcessor), so a bad one is refused before it
travels. Outputs reach each request's mailbox (merged while its consumer lags) through loop.call_soon_threadsafe, one event-loop wake-up per
step; cancelling the consumer (a client that disconnects) aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import queue
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import AsyncIterator, Optional, Sequence, Union

from rtp_llm.engine.core_loop import ThreadTransport, run, run_engine_process
from rtp_llm.engine.input_processor import InputProcessor
from rtp_llm.engine.outputs import RequestOutput, RequestState
from rtp_llm.engine.protocol import (AbortRequest, AddRequest, CoreDied, Rejected, Shutdown, StartupFailed,
                                     StatsUpdate, StepOutputs, UnloadLoRA, WorkerFailed)
from rtp_llm.errors import EngineDeadError, RequestRejected, TPWorkerError
from rtp_llm.lora.adapter import LoRARequest
from rtp_llm.pooling import PoolingParams
from rtp_llm.sampling import SamplingParams

log = logging.getLogger(__name__)

class EngineClient:
    """Request streams over an EngineCore. Subclasses send messages (_send), run the core, and shut it down."""

    processor: InputProcessor
    model_path: str = ""

    def __init__(self, on_death=None):
        """on_death(exc): called once if the engine dies."""
        self._on_death = on_death
        self._streams: dict[str, RequestStream] = {}  # open streams; written on their event loops only
        self._accepting = True
        self._lock = threading.Lock()
        self._stats: dict = {}
        self.dead: Optional[BaseException] = None

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.processor.max_model_len

    def _send(self, msg) -> None:
        raise NotImplementedError

    def shutdown(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def stats(self) -> dict:
        """The core's counters as of its last step."""
        return self._stats

    # --- messages from the core (the engine thread, or this process's reader thread) -------------------------
    def _handle(self, msg) -> None:
        if isinstance(msg, StepOutputs):
            self._stats = msg.stats
            self._deliver_deltas(msg.outputs)
        elif isinstance(msg, Rejected):
            stream = self._streams.get(msg.request_id)
            if stream is not None:
                _call_soon(stream.loop, stream.refuse, msg.error)
        elif isinstance(msg, StatsUpdate):
            self._stats = msg.stats
        elif isinstance(msg, WorkerFailed):
            self.fail(TPWorkerError(msg.message))
        elif isinstance(msg, CoreDied):
            self.fail(msg.error)
        else:
            raise TypeError(f"unexpected message from the engine core: {type(msg).__name__}")

    def fail(self, exc: BaseException) -> None:
        """Marks the engine dead (/health turns 503, new requests are refused) and ends every stream with the
        error. Callable from any thread."""
        with self._lock:
            first = self.dead is None
            if first:
                self.dead = exc
        dead = EngineDeadError(f"the engine has stopped: {exc}")
        for rid in list(self._streams):
            self._deliver(rid, dead)
        if first and self._on_death is not None:
            self._on_death(exc)

    def _deliver_deltas(self, deltas: list) -> None:
        """One event-loop wake-up per step (per loop with open streams) carries the step's deltas."""
        batches: dict = {}
        for d in deltas:
            stream = self._streams.get(d.request_id)
            if stream is not None:
                batches.setdefault(stream.loop, []).append((stream, d))
        for loop, items in batches.items():
            _call_soon(loop, _apply_all, items)

    def _deliver(self, rid: str, exc: BaseException) -> None:
        stream = self._streams.get(rid)
        if stream is not None:
            _call_soon(stream.loop, stream.fail, exc)

    # --- the asyncio side --------------------------------------------------------------------------------------
    def submit(self, prompt: Union[str, Sequence[int]], params: Optional[SamplingParams],
               request_id: Optional[str] = None, pooling: Optional[PoolingParams] = None,
               lora: Optional[LoRARequest] = None) -> "RequestStream":
        """Validates and sends a request; returns its stream at once (no round trip to the core). Raises
        RequestRejected (a bad request) or EngineDeadError; what only the core can refuse (a full queue, an id in
        use) ends the stream with that error, before any output (RequestStream.wait_started)."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine has stopped: {self.dead}")
        if not self._accepting:
            raise EngineDeadError("the server is shutting down")
        rid = request_id or uuid.uuid4().hex
        if rid in self._streams:  # this client routes outputs by id: one open stream per id
            raise RequestRejected(f"request id {rid!r} is already in use")
        request = self.processor.process(rid, prompt, params, pooling=pooling, lora=lora)
        stream = self._streams[rid] = RequestStream(self, rid, asyncio.get_running_loop())
        self._send(AddRequest(request))
        if self.dead is not None:  # died while sending: fail() may have run before the stream was registered
            stream.fail(EngineDeadError(f"the engine has stopped: {self.dead}"))
        return stream

    async def generate(self, prompt: Union[str, Sequence[int]], params: SamplingParams,
                       request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        async with self.submit(prompt, params, request_id) as stream:
            async for out in stream:
                yield out

    def unload_lora(self, name: str) -> None:
        """The engine forgets the adapter once its running requests are done."""
        if self.dead is None:
            self._send(UnloadLoRA(name))

    def abort(self, request_id: str) -> None:
        if self.dead is None:
            self._send(AbortRequest(request_id))

    def stop_accepting(self) -> None:
        self._accepting = False


class ThreadEngineClient(EngineClient):
    """The EngineCore on its own thread of this process; the thread owns the core from here on."""

    def __init__(self, core, on_death=None):
        super().__init__(on_death)
        self.core = core
        self.model_path = core.model_path
        self.processor = core.input_processor()
        self._stats = core.stats()
        self._transport = ThreadTransport(self._handle)
        self._thread = threading.Thread(target=run, args=(core, self._transport), name="rtp-llm-engine",
                                        daemon=True)
        self._thread.start()

    def _send(self, msg) -> None:
        self._transport.commands.put(msg)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._send(Shutdown())
        self._thread.join(timeout)


class ProcessEngineClient(EngineClient):
    """The EngineCore in a process of its own. Tokenisation and chat templates stay in this process;
    detokenisation runs in the engine, which needs the text for stop strings. Two threads here talk to it: a
    writer (so a long prompt never blocks the event loop on a full pipe) and a reader that hands each step's
    outputs to the event loop. If the engine process ends, every stream fails and on_death(exc) runs once."""

    def __init__(self, config, on_death=None, log_level: str = "info"):
        """Starts the engine process and waits until its model is loaded. Start-up errors (a bad checkpoint, too
        little KV memory, ...) are raised here as the engine raised them."""
        from rtp_llm.models.default_model import with_default_model

        super().__init__(on_death)
        config = with_default_model(config)
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked OpenMP / torch state
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=run_engine_process, args=(config, child, log_level), name="rtp-llm-engine",
                                daemon=True)
        self.proc.start()
        child.close()  # only the engine holds its end: its exit reads as EOF here
        with ThreadPoolExecutor(1, thread_name_prefix="rtp-llm-tokenizer") as pool:
            # The tokenizer loads here while the engine loads its weights.
            tokenizer = pool.submit(_load_tokenizer, config)
            self._start(tokenizer)

    def _start(self, tokenizer: Future) -> None:
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            self.proc.join(10)
            raise EngineDeadError(f"the engine process exited during start-up ({self._exit()})") from None
        if isinstance(msg, StartupFailed):  # the engine's error names the problem; a tokenizer error would echo it
            self.proc.join(10)
            raise msg.error
        self.model_path = msg.model_path
        self._stats = msg.stats
        self._closing = False
        self._join_lock = threading.Lock()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._read, name="rtp-llm-engine-reader", daemon=True).start()
        threading.Thread(target=self._write, name="rtp-llm-engine-writer", daemon=True).start()
        try:
            self.processor = InputProcessor(tokenizer.result(), msg.limits)
        except BaseException:
            self.shutdown()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _exit(self) -> str:
        from rtp_llm.distributed.monitor import describe_exit

        code = self.proc.exitcode
        return "still running" if code is None else describe_exit(code)

    def _send(self, msg) -> None:
        self._outbox.put(msg)

    def _join(self, timeout: float) -> None:
        """Waits for the engine process to exit. One thread at a time: two concurrent joins race to reap it, and
        the loser sees a live process that is gone (and would kill a pid that may be reused)."""
        deadline = time.monotonic() + timeout
        if self._join_lock.acquire(timeout=max(0.0, timeout)):
            try:
                self.proc.join(max(0.0, deadline - time.monotonic()))
            finally:
                self._join_lock.release()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Asks the engine to stop (it closes tensor-parallel workers itself); kills it if it does not."""
        self._closing = True
        if self.proc.is_alive():
            self._outbox.put(Shutdown())
            self._join(timeout)
        if self.proc.is_alive():
            log.warning("the engine process did not stop in %.0fs; killing it", timeout)
            self.proc.kill()
            self._join(5)
        self._outbox.put(None)

    def _write(self) -> None:
        while (msg := self._outbox.get()) is not None:
            try:
                self._conn.send(msg)
            except OSError:  # the engine is gone; the reader reports it
                return

    def _read(self) -> None:
        try:
            while True:
                try:
                    msg = self._conn.recv()
                except (EOFError, OSError):
                    break
                self._handle(msg)
        except Exception as exc:  # a bug here must fail the streams, not leave them waiting forever
            log.exception("reading the engine's messages failed")
            self._closing = True
            self.fail(EngineDeadError(f"lost the engine's messages: {type(exc).__name__}: {exc}"))
            return
        self._join(5)
        if not self._closing:
            self.fail(EngineDeadError(f"the engine process (pid {self.proc.pid}) exited: {self._exit()}"))


def _load_tokenizer(config):
    from rtp_llm.tokenizer import Tokenizer

    return Tokenizer.load(config.tokenizer or config.model)


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """loop.call_soon_threadsafe, except that a loop already closed (the server is exiting while the engine still
    reports) drops the call instead of raising on the engine's or the reader's thread."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _apply_all(items) -> None:
    for stream, delta in items:
        stream.apply(delta)


class RequestStream:
    """Outputs of one request, on the event loop that submitted it: the core's deltas are applied to a
    RequestState as they come, and each output taken covers all news since the previous one. Leaving the stream
    before the request finished (an exception, a cancelled task, a disconnected client) aborts the request and
    frees its KV blocks."""

    def __init__(self, engine: EngineClient, request_id: str, loop: asyncio.AbstractEventLoop):
        self.engine, self.request_id, self.loop = engine, request_id, loop
        self.state = RequestState(request_id)
        self.error: Optional[BaseException] = None
        self.finished = False
        self._refused = False
        self._ready = asyncio.Event()

    def apply(self, delta) -> None:
        self.state.apply(delta)
        self._ready.set()

    def fail(self, exc: BaseException) -> None:
        if self.error is None and not self.finished:
            self.error = exc
            self._ready.set()

    def refuse(self, exc: BaseException) -> None:
        """The core did not take the request (queue full, id in use): nothing of it runs, nothing to abort."""
        self._refused = True
        self.fail(exc)

    async def wait_started(self) -> None:
        """Waits for the request's first output or its refusal, and raises the refusal (QueueFullError,
        RequestRejected, EngineDeadError): a route calls it before it commits to a status code."""
        await self._ready.wait()
        if self.error is not None and not self.state.pending:
            self.close()
            raise self.error

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        await self._ready.wait()
        if not self.state.pending:  # only an error is left
            self.close()
            raise self.error
        out = self.state.take()
        if self.error is None:
            self._ready.clear()
        if out.finished:
            self.finished = True
            if self.engine._streams.get(self.request_id) is self:
                del self.engine._streams[self.request_id]
        return out

    def close(self) -> None:
        if self.engine._streams.get(self.request_id) is self:
            del self.engine._streams[self.request_id]
        if not self.finished:
            self.finished = True
            if not self._refused:  # a refused id may be another request's, which must go on
                self.engine.abort(self.request_id)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
