"""ModelRunner: owns the model, the KV buffer, the block bookkeeping, the attention backend and the
sampler, and turns one scheduled step into one model call.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
import torch

from rtp_llm.cache import KVBuffer, KVCacheManager
from rtp_llm.config.model_config import ModelConfig
from rtp_llm.layers.attention import get_backend
from rtp_llm.models.decoder import DecoderLM
from rtp_llm.models.forward_batch import ForwardBatch
from rtp_llm.sampling import Sampler


class ModelRunner:
    def __init__(self, model: DecoderLM, cfg: ModelConfig, num_blocks: int, block_size: int,
                 attention: str = "torch_ref", enable_prefix_cache: bool = True,
                 kv_dtype: torch.dtype | None = None, device: torch.device | str = "cpu", ops=None):
        self.model, self.cfg = model, cfg
        self.block_size = block_size
        self.device = torch.device(device)
        self.manager = KVCacheManager(num_blocks, block_size, enable_prefix_cache)
        self.kv = KVBuffer(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                           dtype=kv_dtype or model.dtype, device=self.device)
        self.attn = get_backend(attention)(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5,
                                           block_size)
        self.sampler = Sampler(ops or model.ops)
        self._seq_ids = itertools.count(1)

    def new_seq_id(self) -> int:
        return next(self._seq_ids)

    def forward(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]], start_positions: Sequence[int],
                slots: Sequence[np.ndarray], need_logits: Sequence[bool] | None = None) -> torch.Tensor:
        """One model call. Sequence i's new tokens sit at start_positions[i].. with slots[i] already
        allocated by the manager; returns float32 logits for the rows that need them."""
        bs = self.block_size
        width = max((s + len(t) + bs - 1) // bs for s, t in zip(start_positions, tokens))
        table = np.empty((len(seq_ids), width), dtype=np.int32)
        self.manager.fill_block_tables(np.asarray(seq_ids, dtype=np.int64), table)
        batch = ForwardBatch.build(tokens, start_positions, slots, table, bs, need_logits, self.device)
        return self.model(batch, self.kv, self.attn)
