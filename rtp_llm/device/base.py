"""The Device interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class DeviceError(RuntimeError):
    """The requested device is not available here; the message says why."""


class Device(ABC):
    name: str = "abstract"
    collective_backend: str = "gloo"      # torch.distributed backend for tensor parallelism
    default_attention: str = "torch_ref"  # AttentionBackend name
    default_block_size: int = 16

    def __init__(self, index: int = 0):
        self.index = index

    @classmethod
    @abstractmethod
    def available(cls) -> tuple[bool, str]:
        """(usable here, why not)."""

    @property
    @abstractmethod
    def torch_device(self) -> torch.device: ...

    def bind_thread(self) -> None:
        """Called on every thread that will run model work (NPUs bind the device per thread)."""

    def synchronize(self) -> None:
        pass

    def memory_info(self) -> tuple[int, int]:
        """(free bytes, total bytes) of the device memory the KV cache comes from."""
        import os

        pages, page = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        return pages * page, total

    def share_host(self, local_ranks: int) -> None:
        """Called when this many tensor-parallel ranks run on this machine (each with its own device here)."""

    def validate_block_size(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")

    def ops(self, config=None) -> Any:
        """The fused-op set the model graph calls (norms, rotary, activation, top-k/top-p); config: the
        EngineConfig, for device-specific choices."""
        from rtp_llm.layers.ops import TorchOps

        return TorchOps()

    def stream(self) -> Any:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.torch_device})"
