"""The AttentionBackend interface.

A backend does two things per layer: writes the new tokens' K/V into the layer's cache view through
the slot mapping, and attends each sequence's new queries over its cached + new keys through the
block table (causal, with the query block anchored at the end of the sequence). Everything it
needs per step is computed once in `prepare` and shared by all layers.

Layer cache view: [2, num_blocks, block_size, kv_heads, head_dim]; K = [0], V = [1].
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from rtp_llm.models.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    name = "abstract"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, block_size: int):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.block_size = block_size

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> Any:
        """Per-step metadata shared by every layer."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_kv: torch.Tensor,
                meta: Any) -> torch.Tensor:
        """q [T, H, D], k/v [T, KVH, D] (RoPE applied) -> attention output [T, H, D]."""
