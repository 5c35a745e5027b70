"""Liveness of tensor-parallel workers.

Each worker bumps a counter in rank 0's TCPStore every second from a background thread (Heartbeat);
rank 0 watches the counters and, for workers it spawned itself, their exit codes (WorkerMonitor).
A worker that exits, or whose counter stops moving for `timeout_s`, is reported once through
on_failure with a message naming its rank. Workers exit when rank 0's store goes away, so neither
side waits forever on the other.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from datetime import timedelta
from typing import Callable, Optional

log = logging.getLogger(__name__)

HEARTBEAT_PERIOD_S = 1.0


def _key(rank: int) -> str:
    return f"rtp_llm/heartbeat/{rank}"


def _client(addr: str, port: int):
    import torch.distributed as dist

    return dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=30))


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Heartbeat:
    """Worker side: proves this rank is alive; exits the process if rank 0's store disappears."""

    def __init__(self, addr: str, port: int, rank: int):
        self.addr, self.port, self.rank = addr, port, rank
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rtp-llm-heartbeat-{rank}", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            store = _client(self.addr, self.port)
            while not self._stop.is_set():
                store.add(_key(self.rank), 1)
                self._stop.wait(HEARTBEAT_PERIOD_S)
        except Exception as exc:
            if self._stop.is_set():
                return
            log.error("tensor-parallel rank %d lost rank 0 (%s); exiting", self.rank, exc)
            os._exit(1)


class WorkerMonitor:
    """Rank 0 side."""

    def __init__(self, addr: str, port: int, size: int, procs: dict[int, subprocess.Popen], timeout_s: float,
                 on_failure: Optional[Callable[[str], None]] = None):
        self.addr, self.port, self.size, self.procs, self.timeout_s = addr, port, size, procs, timeout_s
        self.callbacks: list[Callable[[str], None]] = [on_failure] if on_failure else []
        self.failure: Optional[str] = None
        self._found = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtp-llm-tp-monitor", daemon=True)

    def start(self) -> "WorkerMonitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def diagnose(self, wait_s: Optional[float] = None) -> Optional[str]:
        """Which rank failed; waits for the monitor to find out (a collective can notice first)."""
        self._found.wait(self.timeout_s + 2 * HEARTBEAT_PERIOD_S if wait_s is None else wait_s)
        return self.failure

    def _fail(self, message: str) -> None:
        if self.failure is not None:
            return
        self.failure = message
        log.error("%s", message)
        self._found.set()
        for cb in list(self.callbacks):
            try:
                cb(message)
            except Exception:
                log.exception("failure callback raised")

    def _run(self) -> None:
        try:
            store = _client(self.addr, self.port)
        except Exception as exc:
            self._fail(f"tensor-parallel monitor cannot reach the rendezvous store: {exc}")
            return
        seen = {r: (-1, time.monotonic()) for r in range(1, self.size)}
        while not self._stop.is_set() and self.failure is None:
            for rank, proc in self.procs.items():
                code = proc.poll()
                if code is not None:
                    self._fail(f"tensor-parallel worker rank {rank} (pid {proc.pid}) died: {describe_exit(code)}")
                    return
            now = time.monotonic()
            for rank in seen:
                try:
                    count = store.add(_key(rank), 0)
                except Exception as exc:
                    self._fail(f"tensor-parallel monitor lost the rendezvous store: {exc}")
                    return
                if count != seen[rank][0]:
                    seen[rank] = (count, now)
                elif now - seen[rank][1] > self.timeout_s:
                    self._fail(f"tensor-parallel worker rank {rank} stopped answering "
                               f"(no heartbeat for {self.timeout_s:.0f} s)")
                    return
            self._stop.wait(0.2)
