"""Starting a tensor-parallel group.

Two ways, as with upstream RTP-LLM and vLLM:
- one machine: `start_server --tp_size N` (or LLM(tp_size=N)) is rank 0 and spawns ranks 1..N-1 as
  `python -m rtp_llm.engine.tp_worker` child processes; the rendezvous port is picked free;
- several machines (or torchrun): every process gets torchrun's environment (MASTER_ADDR, MASTER_PORT,
  WORLD_SIZE, RANK, LOCAL_RANK) and runs the same start_server command; RANK 0 serves HTTP, the others
  run the worker loop. WORLD_SIZE must equal --tp_size.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.distributed.group import TensorParallel
from rtp_llm.distributed.monitor import Heartbeat, WorkerMonitor
from rtp_llm.errors import LaunchError

log = logging.getLogger(__name__)

CONFIG_ENV = "RTP_LLM_ENGINE_CONFIG"   # the EngineConfig (JSON) of spawned workers
SPAWNED_ENV = "RTP_LLM_SPAWNED_BY"     # pid of the rank 0 that spawned this worker


@dataclass
class LaunchEnv:
    rank: int
    size: int
    local_rank: int
    local_size: int
    addr: str
    port: int          # 0: pick a free one (rank 0 spawning its own workers)
    external: bool     # ranks were started by torchrun / by hand, not spawned by rank 0


def _int_env(name: str, default: Optional[int] = None) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        if default is None:
            raise LaunchError(f"{name} must be set for a multi-process launch (WORLD_SIZE is set)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"{name}={raw!r} is not an integer") from None


def launch_env(tp_size: int) -> LaunchEnv:
    """torchrun-style variables if WORLD_SIZE > 1 is set, else a single-machine spawn by rank 0."""
    world = os.environ.get("WORLD_SIZE")
    if world not in (None, "", "1"):
        size = _int_env("WORLD_SIZE")
        if size != tp_size:
            raise LaunchError(f"WORLD_SIZE={size} but tp_size={tp_size}; they must match")
        rank = _int_env("RANK")
        if not 0 <= rank < size:
            raise LaunchError(f"RANK={rank} is outside [0, WORLD_SIZE={size})")
        addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        return LaunchEnv(rank, size, _int_env("LOCAL_RANK", 0), _int_env("LOCAL_WORLD_SIZE", 1), addr,
                         _int_env("MASTER_PORT"), True)
    port = _int_env("MASTER_PORT", 0)
    return LaunchEnv(0, tp_size, 0, tp_size, os.environ.get("MASTER_ADDR") or "127.0.0.1", port, False)


def _store(env: LaunchEnv, timeout_s: float):
    import torch.distributed as dist

    # Under torchrun the elastic agent already hosts the store at MASTER_ADDR:MASTER_PORT; every rank joins it.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return dist.TCPStore(env.addr, env.port, env.size, is_master=env.rank == 0 and not agent_store,
                         timeout=timedelta(seconds=max(timeout_s, 60)), wait_for_workers=False)


class TPRuntime:
    """Rank 0's handle on the group: the collectives, the worker monitor, the processes it spawned."""

    def __init__(self, config: EngineConfig, device, env: LaunchEnv):
        self.env = env
        self.procs: dict[int, subprocess.Popen] = {}
        device.share_host(env.local_size)
        store = _store(env, config.tp_timeout_s)
        port = store.port
        if not env.external:
            self._spawn(config, env, port)
        self.monitor = WorkerMonitor(env.addr, port, env.size, self.procs, config.tp_heartbeat_timeout_s)
        try:
            backend = device.collective_backend
            self.tp = TensorParallel(0, env.size, backend, store, config.tp_timeout_s, diagnose=self.monitor.diagnose)
        except Exception:
            self._kill()
            raise
        self.monitor.callbacks.append(self._on_failure)
        self.monitor.start()
        log.info("tensor parallel: %d ranks (%s)%s", env.size, backend,
                 "" if env.external else ", workers " + ", ".join(
                     f"rank {r} pid {p.pid}" for r, p in sorted(self.procs.items())))

    def _on_failure(self, message: str) -> None:
        self.tp.failure = message

    def _spawn(self, config: EngineConfig, env: LaunchEnv, port: int) -> None:
        base = dict(os.environ)
        base.update({
            CONFIG_ENV: json.dumps(dataclasses.asdict(config)), SPAWNED_ENV: str(os.getpid()),
            "MASTER_ADDR": env.addr, "MASTER_PORT": str(port), "WORLD_SIZE": str(env.size),
            "LOCAL_WORLD_SIZE": str(env.local_size),
        })
        for rank in range(1, env.size):
            child = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            self.procs[rank] = subprocess.Popen([sys.executable, "-m", "rtp_llm.engine.tp_worker"], env=child)

    def on_failure(self, callback) -> None:
        """callback(message) runs once, on the monitor's thread, when a worker dies or hangs."""
        self.monitor.callbacks.append(callback)
        if self.monitor.failure is not None:
            callback(self.monitor.failure)

    def _kill(self, grace_s: float = 10.0) -> None:
        for proc in self.procs.values():
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
            proc.wait()

    def close(self) -> None:
        self.monitor.stop()
        if self.monitor.failure is not None:
            # The group is broken and the engine thread may still sit in a collective: do not touch the
            # process group, just make sure no spawned worker outlives us.
            self._kill(grace_s=0.1)
            return
        self.tp.close()
        self._kill()


def join_as_worker(config: EngineConfig, device, env: LaunchEnv) -> tuple[TensorParallel, Heartbeat]:
    """Ranks 1..N-1: heartbeat first (rank 0 watches it from the moment all ranks joined), then the groups."""
    device.share_host(env.local_size)
    heartbeat = Heartbeat(env.addr, env.port, env.rank).start()
    store = _store(env, config.tp_timeout_s)
    tp = TensorParallel(env.rank, env.size, device.collective_backend, store, config.tp_timeout_s)
    return tp, heartbeat
