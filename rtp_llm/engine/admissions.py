"""Requests that wait before they join the scheduler's queue: for their grammar's compilation (structured outputs)
and for their LoRA adapter's load (rtp_llm/lora/manager.py), both on worker threads, so that the step loop keeps
stepping the other requests meanwhile."""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Callable, Optional

GRAMMAR, LORA = "grammar", "lora"


class Admissions:
    def __init__(self):
        self.waiting: dict[str, list[tuple[str, Future]]] = {}  # request id -> (what, its future)
        self._grammar_pool: Optional[ThreadPoolExecutor] = None

    def compile(self, check: Callable, structured_outputs) -> Future:
        if self._grammar_pool is None:
            self._grammar_pool = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        return self._grammar_pool.submit(check, structured_outputs)

    def wait(self, request_id: str, waits: list[tuple[str, Future]]) -> None:
        self.waiting[request_id] = waits

    def discard(self, request_id: str) -> None:
        self.waiting.pop(request_id, None)  # what it waited for finishes unheeded

    def ready(self, idle: bool, settle: Optional[Callable[[], None]] = None) -> list[tuple[str, Optional[tuple]]]:
        """The requests whose waits are over: (id, None) to admit, or (id, (what, exception)) for the first that
        failed. idle: nothing else to step, so wait a little for one. settle: takes finished adapter loads in first
        (called after the snapshot of what is done, so every adapter a ready request needs is in)."""
        if not self.waiting:
            return []
        if idle:
            futures_wait([f for waits in self.waiting.values() for _, f in waits], timeout=0.005,
                         return_when=FIRST_COMPLETED)
        done = [rid for rid, waits in self.waiting.items() if all(f.done() for _, f in waits)]
        if settle is not None and done:
            settle()
        out = []
        for rid in done:
            waits = self.waiting.pop(rid)
            failed = next(((what, f.exception()) for what, f in waits if f.exception() is not None), None)
            out.append((rid, failed))
        return out

    def close(self) -> None:
        pool, self._grammar_pool = self._grammar_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
