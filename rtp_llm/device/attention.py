"""Attention backends: the interface every device's backend implements, and torch_ref, the reference.

A backend does two things per layer: writes the new tokens' K/V into the layer's cache view through the slot
mapping, and attends each sequence's new queries over its cached + new keys through the block table (causal,
with the query block anchored at the end of the sequence). Everything it needs per step is computed once in
`prepare` and shared by all layers. Layer cache view: [2, num_blocks, block_size, kv_heads, head_dim]; K = [0],
V = [1]. Device backends (device/cpu/attention.py, device/npu/attention.py) must match torch_ref.

torch_ref runs plain torch ops on any device, any block size >= 1: it writes K/V through the slot mapping, then
gathers each sequence's KV through its block table into a padded [B, max_kv, KVH, D] batch and runs
scaled-dot-product attention with a mask that is causal (query i of a sequence of kv_len keys with q_len new
tokens sees keys j <= kv_len - q_len + i) and hides the padding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rtp_llm.device.forward_batch import ForwardBatch


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


@dataclass
class RefMeta:
    slots: torch.Tensor        # [T] int64
    q_index: torch.Tensor      # [B, max_q] flat token index (0 where padded)
    q_valid: torch.Tensor      # [B, max_q] bool
    kv_slots: torch.Tensor     # [B, max_kv] slot of each key (0 where padded)
    mask: torch.Tensor         # [B, 1, max_q, max_kv] bool, True = attend


class TorchRefAttention(AttentionBackend):
    name = "torch_ref"

    def prepare(self, batch: ForwardBatch) -> RefMeta:
        dev = batch.input_ids.device
        q_lens = torch.tensor(batch.q_lens, dtype=torch.int64).to(dev)
        kv_lens = torch.tensor(batch.kv_lens, dtype=torch.int64).to(dev)
        max_q, max_kv = max(batch.q_lens), max(batch.kv_lens)
        starts = torch.cumsum(q_lens, 0) - q_lens
        i = torch.arange(max_q, device=dev)
        q_valid = i[None, :] < q_lens[:, None]
        q_index = torch.where(q_valid, starts[:, None] + i[None, :], torch.zeros((), dtype=torch.int64, device=dev))
        j = torch.arange(max_kv, device=dev)
        bs = batch.block_size
        n_blocks = (max_kv + bs - 1) // bs
        blocks = batch.block_table[:, :n_blocks].to(torch.int64)
        kv_slots = blocks[:, j // bs] * bs + (j % bs)[None, :]
        kv_valid = j[None, :] < kv_lens[:, None]
        kv_slots = torch.where(kv_valid, kv_slots, torch.zeros((), dtype=torch.int64, device=dev))
        causal = j[None, None, :] <= (kv_lens - q_lens)[:, None, None] + i[None, :, None]
        mask = (causal & kv_valid[:, None, :])[:, None]
        return RefMeta(batch.slot_mapping.to(torch.int64), q_index, q_valid, kv_slots, mask)

    def forward(self, q, k, v, layer_kv, meta: RefMeta):
        self.write_kv(k, v, layer_kv, meta.slots)
        return self.attend(q, layer_kv, meta)

    def write_kv(self, k, v, layer_kv, slots) -> None:
        kv_heads, d = self.num_kv_heads, self.head_dim
        layer_kv[0].view(-1, kv_heads, d)[slots] = k.to(layer_kv.dtype)
        layer_kv[1].view(-1, kv_heads, d)[slots] = v.to(layer_kv.dtype)

    def attend(self, q, layer_kv, meta: RefMeta):
        kv_heads, d = self.num_kv_heads, self.head_dim
        k_cache = layer_kv[0].view(-1, kv_heads, d)
        v_cache = layer_kv[1].view(-1, kv_heads, d)
        qb = q[meta.q_index].transpose(1, 2)              # [B, H, max_q, D]
        kb = k_cache[meta.kv_slots].transpose(1, 2)       # [B, KVH, max_kv, D]
        vb = v_cache[meta.kv_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            qb, kb.to(q.dtype), vb.to(q.dtype), attn_mask=meta.mask, scale=self.scale,
            enable_gqa=self.num_heads != kv_heads)
        return out.transpose(1, 2)[meta.q_valid]          # [T, H, D] in flat order
