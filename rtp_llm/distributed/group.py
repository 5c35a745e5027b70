"""TensorParallel: this process's place in the tensor-parallel group and the collectives the model calls.

Two process groups on torch.distributed: the model's group on the device's collective backend (gloo
on CPU, nccl on CUDA, hccl on Ascend) with a bounded timeout, and a gloo group for the step messages
on which workers may wait while the server is idle. A TCPStore hosted by rank 0 rendezvouses the ranks
and carries the workers' heartbeats (rtp_llm/distributed/monitor.py).

A collective that fails (a peer died: its sockets close) or times out (a peer hangs) raises
TPWorkerError naming the rank when the monitor knows it; tensor parallelism cannot resynchronise
after that, so the engine treats it as fatal.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Callable, Optional

import torch

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.distributed.step_message import IDLE_TIMEOUT, KIND_STEP, KIND_STOP, StepChannel, StepMessage
from rtp_llm.errors import TPWorkerError
from rtp_llm.models.sharding import TPShard

log = logging.getLogger(__name__)


class TensorParallel:
    def __init__(self, rank: int, size: int, backend: str, store, timeout_s: float,
                 diagnose: Optional[Callable[[], Optional[str]]] = None):
        import torch.distributed as dist

        self.rank, self.size, self.backend, self.store = rank, size, backend, store
        self._diagnose = diagnose
        self.failure: Optional[str] = None
        dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                timeout=timedelta(seconds=timeout_s))
        self.host_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        self.channel = StepChannel(self.host_group)
        self.bytes_reduced = 0  # payload bytes this rank put into all-reduces and gathers (benchmarks)
        self._closed = False

    def shard(self, cfg: ModelConfig) -> TPShard:
        return TPShard.plan(cfg, self.size, self.rank)

    # --- collectives ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _guard(self, what: str):
        try:
            yield
        except Exception as exc:  # gloo/nccl/hccl report dead or hung peers as RuntimeError (or DistBackendError)
            who = self.failure or (self._diagnose() if self._diagnose else None)
            raise TPWorkerError(f"tensor-parallel {what} failed: {who or exc}") from exc

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums x over the ranks in place (every rank gets the same result) and returns it."""
        import torch.distributed as dist

        self.bytes_reduced += x.numel() * x.element_size()
        with self._guard("all-reduce"):
            dist.all_reduce(x)
        return x

    def all_reduce_min(self, value: int) -> int:
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        with self._guard("all-reduce"):
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.host_group)
        return int(t)

    def gather_vocab(self, local: torch.Tensor, shard: TPShard, vocab_size: int) -> Optional[torch.Tensor]:
        """[R, local vocab] logits of every rank -> [R, vocab] on rank 0 (None elsewhere)."""
        import torch.distributed as dist

        rows = local.shape[0]
        if local.shape[1] < shard.vocab_chunk:  # the last shard is shorter: pad to the common width
            local = torch.nn.functional.pad(local, (0, shard.vocab_chunk - local.shape[1]))
        local = local.contiguous()
        self.bytes_reduced += local.numel() * local.element_size()
        with self._guard("logits gather"):
            if self.backend == "gloo":
                parts = [torch.empty_like(local) for _ in range(self.size)] if self.rank == 0 else None
                dist.gather(local, parts, dst=0)
            else:  # NCCL/HCCL: all_gather is the collective every version of both supports
                parts = [torch.empty_like(local) for _ in range(self.size)]
                dist.all_gather(parts, local)
        if self.rank != 0:
            return None
        return torch.cat(parts, dim=1)[:rows, :vocab_size]

    # --- step messages -------------------------------------------------------------------------------
    def send_step(self, msg: StepMessage) -> None:
        with self._guard("step broadcast"):
            self.channel.send(KIND_STEP, msg.encode())

    def recv_step(self) -> Optional[StepMessage]:
        """The next step (workers), or None when rank 0 says stop."""
        with self._guard("step broadcast"):
            kind, payload = self.channel.recv()
        return StepMessage.decode(payload) if kind == KIND_STEP else None

    # --- lifetime ------------------------------------------------------------------------------------
    def close(self, stop_workers: bool = True) -> None:
        import torch.distributed as dist

        if self._closed:
            return
        self._closed = True
        if stop_workers and self.rank == 0 and self.failure is None:
            try:
                self.channel.send(KIND_STOP)
            except Exception:  # workers already gone
                pass
        try:
            dist.destroy_process_group()
        except Exception:
            log.debug("destroy_process_group failed", exc_info=True)
