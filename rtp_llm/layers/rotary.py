"""Rotary position embedding (rotate-half / NeoX style) with cached cos/sin tables.

Inverse frequencies follow the Hugging Face definitions of the default, `linear` and `llama3`
RoPE types; cos/sin are computed in float32 per position and cached up to the largest position
seen (grown by doubling), then gathered by position id for each step. The rotation itself is the device's op (TorchOps.rotary).
"""

from __future__ import annotations

import math

import torch

from rtp_llm.config.model_config import RopeConfig


def inv_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.type == "linear":
        inv = inv / rope.factor
    elif rope.type == "llama3":
        low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
        high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class RotaryEmbedding:
    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int = 4096, device="cpu"):
        self.head_dim = head_dim
        self.inv_freq = inv_frequencies(rope, head_dim).to(device)
        self._cos = self._sin = None
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # the tables cast to a step's dtype
        self._build(max_positions)

    def _build(self, n: int) -> None:
        pos = torch.arange(n, dtype=torch.int64, device=self.inv_freq.device).float()
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos, self._sin = emb.cos(), emb.sin()
        self._tables = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, head_dim] cos and sin for these positions (built once per step, shared by all layers).
        max_position comes from the host, so growing the table never reads the device."""
        need = max_position + 1
        if need > self._cos.shape[0]:
            self._build(max(need, 2 * self._cos.shape[0]))
        tables = self._tables.get(dtype)
        if tables is None:  # cast once (the same values as casting the rows each step)
            tables = self._tables[dtype] = (self._cos.to(dtype), self._sin.to(dtype))
        # index_select: advanced indexing wakes torch's OpenMP team on a prefill's rows
        return tables[0].index_select(0, positions), tables[1].index_select(0, positions)
