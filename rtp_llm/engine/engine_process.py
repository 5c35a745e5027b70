"""EngineProcess: the LLMEngine in a process of its own, behind the same asyncio face as AsyncEngine.

The HTTP server runs it this way (as vLLM runs its EngineCore): the engine loop gets a whole interpreter,
so a step never waits for the GIL while the server's event loop parses requests and formats responses.
On 2 cores, with the engine on a thread of the server process, that wait cost about half the serving
throughput. Tokenisation and chat templates stay in the server process; detokenisation runs in the
engine, which needs the text for stop strings.

Two threads in this process talk to the engine: a writer (so a long prompt never blocks the event loop
on a full pipe) and a reader that rebuilds RequestOutputs from the engine's deltas and hands each step's
outputs to the event loop in one callback. If the engine process ends, every stream fails and
on_death(exc) runs once.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

from rtp_llm.engine.async_engine import EngineFront
from rtp_llm.engine.errors import EngineDeadError
from rtp_llm.engine.outputs import CompletionOutput, RequestOutput

log = logging.getLogger(__name__)


class EngineProcess(EngineFront):
    def __init__(self, config, on_death=None, log_level: str = "info"):
        """Starts the engine process and waits until its model is loaded. Start-up errors (a bad checkpoint,
        too little KV memory, ...) are raised here as the engine raised them."""
        super().__init__(on_death)
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked OpenMP / torch state
        self._conn, child = ctx.Pipe()
        from rtp_llm.engine.engine_core import run_engine_core

        self.proc = ctx.Process(target=run_engine_core, args=(config, child, log_level), name="rtp-llm-engine",
                                daemon=True)
        self.proc.start()
        child.close()  # only the engine holds its end: its exit reads as EOF here
        with ThreadPoolExecutor(1, thread_name_prefix="rtp-llm-tokenizer") as pool:
            # The tokenizer loads here while the engine loads its weights.
            tokenizer = pool.submit(_load_tokenizer, config)
            self._start(config, tokenizer)

    def _start(self, config, tokenizer: Future) -> None:
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            self.proc.join(10)
            raise EngineDeadError(f"the engine process exited during start-up ({self._exit()})") from None
        if kind == "error":  # the engine's error names the problem; a tokenizer error would only echo it
            self.proc.join(10)
            raise payload
        self.model_path: str = payload["model_path"]
        self.max_model_len = payload["max_model_len"]
        self._stats: dict = payload["stats"]
        self._closing = False
        self._adds: dict[str, object] = {}  # rid -> done callback of a submit awaiting its ack (under _lock)
        self._partial: dict[str, _Accumulated] = {}
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._read, name="rtp-llm-engine-reader", daemon=True).start()
        threading.Thread(target=self._write, name="rtp-llm-engine-writer", daemon=True).start()
        try:
            self.tokenizer = tokenizer.result()
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

    # --- EngineFront ---------------------------------------------------------------------------------
    def _send_add(self, rid, prompt, params, done) -> None:
        with self._lock:
            if self.dead is not None:
                done(EngineDeadError(f"the engine has stopped: {self.dead}"))
                return
            self._adds[rid] = done
        self._outbox.put(("add", rid, prompt, params))

    def abort(self, request_id: str) -> None:
        if self.dead is None:
            self._outbox.put(("abort", request_id))

    def stats(self) -> dict:
        return self._stats

    def _on_fail(self, exc: BaseException) -> None:
        with self._lock:
            adds, self._adds = self._adds, {}
        for done in adds.values():
            done(EngineDeadError(f"the engine has stopped: {exc}"))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Asks the engine to stop (it closes tensor-parallel workers itself); kills it if it does not."""
        self._closing = True
        if self.proc.is_alive():
            self._outbox.put(("stop",))
            self.proc.join(timeout)
        if self.proc.is_alive():
            log.warning("the engine process did not stop in %.0fs; killing it", timeout)
            self.proc.kill()
            self.proc.join(5)
        self._outbox.put(None)

    # --- the pipe ------------------------------------------------------------------------------------
    def _write(self) -> None:
        while (msg := self._outbox.get()) is not None:
            try:
                self._conn.send(msg)
            except OSError:  # the engine is gone; the reader reports it
                return

    def _read(self) -> None:
        try:
            self._read_messages()
        except Exception as exc:  # a bug here must fail the streams, not leave them waiting forever
            log.exception("reading the engine's messages failed")
            self._closing = True
            self.fail(EngineDeadError(f"lost the engine's messages: {type(exc).__name__}: {exc}"))
            return
        self.proc.join(5)
        if not self._closing:
            self.fail(EngineDeadError(f"the engine process (pid {self.proc.pid}) exited: {self._exit()}"))

    def _read_messages(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                return
            kind = msg[0]
            if kind == "out":
                self._stats = msg[2]
                self._deliver_outputs([self._rebuild(w) for w in msg[1]])
            elif kind == "added":
                with self._lock:
                    done = self._adds.pop(msg[1], None)
                if done is not None:
                    done(msg[2])
            elif kind == "stats":
                self._stats = msg[1]
            elif kind == "fatal":
                from rtp_llm.distributed.group import TPWorkerError

                self.fail(TPWorkerError(msg[1]))
            elif kind == "died":
                self.fail(msg[1])

    def _rebuild(self, wire: tuple) -> RequestOutput:
        rid, prompt, finished, cached, error, metrics, comps = wire
        acc = self._partial.get(rid)
        if acc is None:
            acc = self._partial[rid] = _Accumulated(prompt)
        outs = []
        for index, d_text, d_ids, d_lps, reason, stop_reason, full in comps:
            text, ids, lps = acc.sample(index, d_text, d_ids, d_lps, full)
            outs.append(CompletionOutput(index, text, ids, d_text, d_ids, lps, d_lps, reason, stop_reason))
        if finished:
            del self._partial[rid]
        return RequestOutput(rid, acc.prompt, outs, finished, cached, error, metrics)


def _load_tokenizer(config):
    from rtp_llm.tokenizer import Tokenizer

    path = config.tokenizer or config.model
    if path is None:
        from rtp_llm.models.default_model import default_model_path

        path = default_model_path()
    return Tokenizer.load(path)


class _Accumulated:
    """The running totals of one request's samples, from the engine's deltas."""

    def __init__(self, prompt: Optional[list[int]]):
        self.prompt = prompt or []
        self.samples: dict[int, list] = {}  # index -> [text, token ids, logprobs or None]

    def sample(self, index: int, d_text: str, d_ids: list[int], d_lps, full):
        s = self.samples.get(index)
        if s is None:
            s = self.samples[index] = ["", [], None if d_lps is None else []]
        if full is not None:  # the last output carries the engine's own totals
            s[0], s[1], s[2] = full[0], list(full[1]), full[2]
        else:
            s[0] += d_text
            s[1].extend(d_ids)
            if d_lps is not None:
                s[2].extend(d_lps)
        # Copies: an earlier output still queued for a slow consumer must not change under it.
        return s[0], list(s[1]), None if s[2] is None else list(s[2])
