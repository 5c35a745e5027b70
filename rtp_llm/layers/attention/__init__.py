"""Attention backends: one per device family, all reading and writing the same merged KV layout."""

from rtp_llm.layers.attention.base import AttentionBackend
from rtp_llm.layers.attention.torch_ref import TorchRefAttention

BACKENDS = {"torch_ref": TorchRefAttention}


def get_backend(name: str) -> type[AttentionBackend]:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join(BACKENDS)}") from None


__all__ = ["AttentionBackend", "BACKENDS", "TorchRefAttention", "get_backend"]
