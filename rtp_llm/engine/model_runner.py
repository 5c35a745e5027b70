"""ModelRunner: owns the model, the KV buffer, the block bookkeeping, the attention backend and the
sampler, and turns one scheduled step into one model call.

With tensor parallelism, rank 0's runner broadcasts each step (rtp_llm/distributed/step_message.py)
before running it; the other ranks' runners have no block manager and only `execute` what they receive.
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

_GiB = 1 << 30


def resolve_block_size(config, device) -> int:
    block_size = config.block_size or device.default_block_size
    device.validate_block_size(block_size)
    return block_size


def kv_block_count(config, kv_heads: int, model_cfg: ModelConfig, kv_dtype: torch.dtype, block_size: int,
                   device) -> int:
    """Explicit count, else kv_cache_memory_gb, else 1 GiB on CPU or a fraction of free device memory.
    kv_heads: the heads this rank holds (all of them without tensor parallelism)."""
    if config.num_blocks is not None:
        return config.num_blocks
    per_block = KVBuffer.bytes_per_block(model_cfg.num_layers, block_size, kv_heads, model_cfg.head_dim, kv_dtype)
    if config.kv_cache_memory_gb is not None:
        budget = int(config.kv_cache_memory_gb * _GiB)
    elif device.name == "cpu":
        budget = _GiB
    else:
        free, _ = device.memory_info()
        budget = int(free * config.kv_cache_memory_fraction)
    return budget // per_block + 1  # + the padding block


class ModelRunner:
    def __init__(self, model: DecoderLM, cfg: ModelConfig, num_blocks: int, block_size: int,
                 attention: str = "torch_ref", enable_prefix_cache: bool = True,
                 kv_dtype: torch.dtype | None = None, device: torch.device | str = "cpu", ops=None,
                 with_manager: bool = True, tp=None):
        self.model, self.cfg = model, cfg
        self.block_size = block_size
        self.device = torch.device(device)
        self.tp = tp if tp is not None and tp.size > 1 else None
        self.manager = KVCacheManager(num_blocks, block_size, enable_prefix_cache) if with_manager else None
        heads, kv_heads = model.shard.num_heads, model.shard.num_kv_heads  # this rank's share
        self.kv = KVBuffer(cfg.num_layers, num_blocks, block_size, kv_heads, cfg.head_dim,
                           dtype=kv_dtype or model.dtype, device=self.device, zeros=(ops or model.ops).zeros_buffer)
        self.attn = get_backend(attention)(heads, kv_heads, cfg.head_dim, cfg.head_dim ** -0.5, block_size)
        self.sampler = Sampler(ops or model.ops)
        self._seq_ids = itertools.count(1)

    def new_seq_id(self) -> int:
        return next(self._seq_ids)

    def forward(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]], start_positions: Sequence[int],
                slots: Sequence[np.ndarray], need_logits: Sequence[bool] | None = None,
                copies: Sequence[tuple[int, int]] = (), greedy: bool = False):
        """One model call. Sequence i's new tokens sit at start_positions[i].. with slots[i] already
        allocated by the manager; copy-on-write block copies are applied first. Returns float32 logits
        for the rows that need them, or with `greedy` (all those rows sampled greedily, nothing reshaping
        their logits) possibly their argmax only (GreedyTokens; never under tensor parallelism)."""
        bs = self.block_size
        width = max((s + len(t) + bs - 1) // bs for s, t in zip(start_positions, tokens))
        table = np.empty((len(seq_ids), width), dtype=np.int32)
        self.manager.fill_block_tables(np.asarray(seq_ids, dtype=np.int64), table)
        if self.tp is not None:
            from rtp_llm.distributed.step_message import StepMessage

            need = [True] * len(tokens) if need_logits is None else list(need_logits)
            self.tp.send_step(StepMessage([np.asarray(t) for t in tokens], list(start_positions), list(slots), need,
                                          table, list(copies)))
        return self.execute(tokens, start_positions, slots, table, need_logits, copies, greedy)

    def execute(self, tokens, start_positions, slots, table: np.ndarray, need_logits=None, copies=(), greedy=False):
        """The model call itself, identical on every tensor-parallel rank (logits only on rank 0)."""
        self.kv.copy_blocks(copies)
        batch = ForwardBatch.build(tokens, start_positions, slots, table, self.block_size, need_logits, self.device)
        return self.model(batch, self.kv, self.attn, greedy=greedy)
