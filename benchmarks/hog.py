"""A co-tenant for benchmarks: a process pinned to one core that computes for `on` seconds, then sleeps for `off`,
over and over, as another tenant of a shared VM takes a core for a while. benchmarks.run --hog ON,OFF runs one
beside the measured rounds, so an engine's figures say how it degrades when it loses part of a core."""

from __future__ import annotations

import multiprocessing as mp
import os
import time


def _spin(cpu: int, on: float, off: float) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        end = time.monotonic() + on
        x = 0
        while time.monotonic() < end:
            for _ in range(10000):
                x += 1
        if off > 0:
            time.sleep(off)


class Hog:
    """Started with `with Hog(on, off):`; pinned to the last CPU this process may run on."""

    def __init__(self, on: float, off: float, cpu: int | None = None):
        self.on, self.off = on, off
        self.cpu = cpu if cpu is not None else max(os.sched_getaffinity(0))
        self.proc = None

    def __enter__(self) -> "Hog":
        self.proc = mp.get_context("spawn").Process(target=_spin, args=(self.cpu, self.on, self.off), daemon=True)
        self.proc.start()
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.join(5)

    def describe(self) -> str:
        return f"a busy process on cpu {self.cpu}, {self.on:g} s on / {self.off:g} s off"


def parse(spec: str) -> Hog:
    """'ON,OFF' in seconds, e.g. '2,3'."""
    on, off = (float(x) for x in spec.split(","))
    if on <= 0 or off < 0:
        raise ValueError(f"--hog ON,OFF needs ON > 0 and OFF >= 0, got {spec!r}")
    return Hog(on, off)
