"""How many KV blocks an engine gets: an explicit count, else an explicit size in GiB, else what the device
offers (Device.kv_cache_budget: a fixed size on CPU, a fraction of free accelerator memory elsewhere)."""

from __future__ import annotations

import torch

from rtp_llm.cache.kv_buffer import KVBuffer

GiB = 1 << 30


def kv_cache_blocks(config, device, num_layers: int, block_size: int, kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    """Blocks of the pool, the padding block included. kv_heads: the heads this rank holds (all of them without
    tensor parallelism). `config` is an EngineConfig, `device` answers kv_cache_budget(config) in bytes."""
    if config.num_blocks is not None:
        return config.num_blocks
    per_block = KVBuffer.bytes_per_block(num_layers, block_size, kv_heads, head_dim, dtype)
    if config.kv_cache_memory_gb is not None:
        budget = int(config.kv_cache_memory_gb * GiB)
    else:
        budget = device.kv_cache_budget(config)
    return budget // per_block + 1
