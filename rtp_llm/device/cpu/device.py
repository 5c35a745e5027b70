"""CPU: the embedded default. Its op set and attention backend run the C++ kernels of rtp_llm/_ops.so."""

from __future__ import annotations

import os

import torch

from rtp_llm.device.attention import TorchRefAttention
from rtp_llm.device.base import Device
from rtp_llm.device.cpu.attention import CpuAttention
from rtp_llm.device.cpu.linear import GEMV_WEIGHTS
from rtp_llm.device.cpu.ops import GGUF_BLOCKS, CpuOps

GiB = 1 << 30


class CpuDevice(Device):
    name = "cpu"
    collective_backend = "gloo"
    attention_backends = {"torch_ref": TorchRefAttention, "cpu": CpuAttention}
    default_attention = "cpu"
    runs_lora = True
    # The KV cache when the config gives no size: host memory is shared with everything else, so a fixed size.
    DEFAULT_KV_CACHE_BYTES = GiB
    # Tokens per KV block (vLLM's CPU backend defaults to 128 too): a decode step reads each sequence's keys and
    # values block by block, and the hardware prefetchers restart at every block, so short blocks cost
    # (benchmarks.cpu_decode_attention --block-size). The price: the prefix cache matches whole 128-token blocks.
    default_block_size = 128

    def __init__(self, index: int = 0, options=None):
        super().__init__(index, options)
        self.gemv_weights = self.options.get("cpu_gemv_weights", "auto")
        if self.gemv_weights not in GEMV_WEIGHTS:
            raise ValueError(f"cpu_gemv_weights must be one of {', '.join(GEMV_WEIGHTS)}, got {self.gemv_weights!r}")
        self.gguf_blocks = self.options.get("cpu_gguf_blocks", "auto")
        if self.gguf_blocks not in GGUF_BLOCKS:
            raise ValueError(f"cpu_gguf_blocks must be one of {', '.join(GGUF_BLOCKS)}, got {self.gguf_blocks!r}")
        _check_omp_wait_policy()

    @classmethod
    def available(cls):
        return True, ""

    @classmethod
    def self_check(cls) -> list:
        from rtp_llm.device.cpu.self_check import check_cpu

        return check_cpu()

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def kv_cache_budget(self, config) -> int:
        return self.DEFAULT_KV_CACHE_BYTES

    def check_fits(self, weight_bytes: int, kv_bytes: int) -> None:
        """Host memory: weights + KV cache against MemAvailable, before loading, instead of the OOM killer later."""
        available = _mem_available()
        if available is None or weight_bytes + kv_bytes <= available:
            return
        gib = 1 << 30
        raise ValueError(
            f"the model needs about {weight_bytes / gib:.2f} GiB of weights and the KV cache "
            f"{kv_bytes / gib:.2f} GiB, {(weight_bytes + kv_bytes) / gib:.2f} GiB in all, but this host has "
            f"{available / gib:.2f} GiB available: lower --kv_cache_memory_gb (or --num_blocks), keep a GGUF's "
            f"blocks as stored (--quantization auto), use --quantization int8 or --dtype bfloat16, or serve a "
            f"smaller model")

    def zeros(self, shape, dtype):
        # On 2 MB pages (rtp_llm/cpp/memory/huge_pages.cc): the decode kernels stream the KV cache, and on 4 KB
        # pages its scattered blocks cost a TLB miss and a prefetcher restart every 4 KB.
        from rtp_llm._native import ops

        return ops().huge_page_zeros(list(shape), dtype)

    def share_host(self, local_ranks: int) -> None:
        # Ranks on one machine share its cores; oversubscribed OpenMP pools would fight over them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))

    def ops(self) -> CpuOps:
        return CpuOps(gemv_weights=self.gemv_weights, gguf_blocks=self.gguf_blocks)


def _mem_available():
    """Linux's MemAvailable (free + reclaimable cache) in bytes; None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


_omp_warned = False


def _check_omp_wait_policy() -> None:
    """Once per process: a warning when torch's OpenMP threads spin between ops (see rtp_llm/__init__.py), because
    torch was imported before rtp_llm and OMP_WAIT_POLICY was not set. An explicit setting is the user's choice."""
    global _omp_warned
    import rtp_llm

    if _omp_warned or rtp_llm.OMP_PASSIVE_SET or "OMP_WAIT_POLICY" in os.environ:
        return
    _omp_warned = True
    import logging

    logging.getLogger("rtp_llm").warning(
        "torch was imported before rtp_llm and OMP_WAIT_POLICY is not set: torch's OpenMP threads spin between "
        "ops on the cores the engine's kernels use (measured 20-35% lower bf16 throughput). Export "
        "OMP_WAIT_POLICY=PASSIVE, or import rtp_llm before torch.")

