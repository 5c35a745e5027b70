"""The Device interface: every question the engine asks about the hardware it runs on, answered by name.

A device says where tensors live, how to query memory and synchronise, which collective backend tensor
parallelism uses, its default KV block size and KV-cache budget, how the KV buffer is allocated, which attention
backend and which op set (kernels) the model graph runs. The engine never asks which device it is.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, Optional

import torch

from rtp_llm.config.model_config import parse_dtype
from rtp_llm.device.attention import AttentionBackend, TorchRefAttention
from rtp_llm.device.torch_ops import TorchOps
from rtp_llm.errors import DeviceError

__all__ = ["Device", "DeviceError"]


class Device(ABC):
    name: str = "abstract"
    collective_backend: str = "gloo"      # torch.distributed backend for tensor parallelism
    default_block_size: int = 16
    # Query tokens one request may bring to a decode round (speculative decoding: 1 + drafts); None = no limit.
    max_decode_query_tokens: Optional[int] = None
    # LoRA adapters' deltas (rtp_llm/lora/) checked on this device: the CPU so far
    runs_lora: bool = False
    # attention backends by name; None picks `default_attention`
    attention_backends: dict[str, type[AttentionBackend]] = {"torch_ref": TorchRefAttention}
    default_attention: str = "torch_ref"

    def __init__(self, index: int = 0, options: Optional[dict] = None):
        """options: EngineConfig.device_options; a device reads the ones named for it and ignores the rest."""
        self.index = index
        self.options = dict(options or {})

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
        """(free bytes, total bytes) of the memory the KV cache comes from (host memory here)."""
        pages, page = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * page, os.sysconf("SC_PHYS_PAGES") * page

    def model_dtype(self, requested, stored: torch.dtype) -> torch.dtype:
        """The dtype weights, activations and the KV cache run in: --dtype, or for 'auto' the checkpoint's own
        (`stored`: what its weights load as)."""
        return parse_dtype(requested, default=stored)

    def check_fits(self, weight_bytes: int, kv_bytes: int) -> None:
        """Raises ValueError, naming both sizes and the flags that change them, when the model's weights and KV cache
        cannot fit the memory they go to. Accelerators: their allocator's own error is already clear."""

    def kv_cache_budget(self, config) -> int:
        """Bytes for the KV cache when the config gives no size: a fraction of free device memory."""
        free, _ = self.memory_info()
        return int(free * config.kv_cache_memory_fraction)

    def zeros(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A large, long-lived zeroed buffer on this device (the KV cache)."""
        return torch.zeros(shape, dtype=dtype, device=self.torch_device)

    def share_host(self, local_ranks: int) -> None:
        """Called when this many tensor-parallel ranks run on this machine (each with its own device here)."""

    @classmethod
    def self_check(cls) -> list:
        """This device's lines of `python -m rtp_llm.doctor` (rtp_llm/device/self_check.py's Check)."""
        return []

    def check_model(self, cfg) -> None:
        """Raises ValueError naming the constraint when this device's kernels cannot run the model's shapes (a head
        dim its fused attention refuses), at load rather than at the first forward."""

    def decode_graphs(self, model, kv, attn, block_size: int, max_model_len: int, max_batch: int):
        """A callable that runs decode steps from captured graphs (its runs(batch) says which), or None: every step
        eager."""
        return None

    def validate_block_size(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")

    def attention_backend(self, name: Optional[str] = None) -> type[AttentionBackend]:
        """The attention backend class by name (None: this device's default)."""
        name = name or self.default_attention
        try:
            return self.attention_backends[name]
        except KeyError:
            raise ValueError(f"unknown attention backend {name!r} on {self.name}; available: "
                             f"{', '.join(sorted(self.attention_backends))}") from None

    def ops(self) -> TorchOps:
        """The op set the model graph and the sampler call (norms, rotary, activation, linear kernels,
        top-k/top-p)."""
        return TorchOps()

    def stream(self) -> Any:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.torch_device})"
