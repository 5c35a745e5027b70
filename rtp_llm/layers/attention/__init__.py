"""Attention backends: one per device family, all reading and writing the same merged KV layout."""

from rtp_llm.layers.attention.base import AttentionBackend
from rtp_llm.layers.attention.torch_ref import TorchRefAttention

BACKENDS = {"torch_ref": TorchRefAttention}


def get_backend(name: str) -> type[AttentionBackend]:
    if name == "cpu":  # imported on demand: it loads the C++ kernels
        from rtp_llm.layers.attention.cpu import CpuAttention

        return CpuAttention
    if name == "ascend":  # imported on demand: it needs torch_npu
        from rtp_llm.layers.attention.ascend import AscendAttention

        return AscendAttention
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; available: torch_ref, cpu, ascend") from None


__all__ = ["AttentionBackend", "BACKENDS", "TorchRefAttention", "get_backend"]
