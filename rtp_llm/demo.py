"""A small demo of the KV-cache runtime: requests sharing a system prompt reuse its blocks.

    python -m rtp_llm.demo
"""

from __future__ import annotations

import numpy as np

from rtp_llm.cache import KVBuffer, KVCacheManager


def main() -> None:
    block_size, num_blocks = 16, 64
    manager = KVCacheManager(num_blocks=num_blocks, block_size=block_size)
    kv = KVBuffer(num_layers=2, num_blocks=num_blocks, block_size=block_size, kv_heads=2, head_dim=8)
    print(f"KV buffer: {kv.buffer.shape} ({kv.nbytes / 1024:.0f} KiB, one allocation); "
          f"{num_blocks - 1} usable blocks of {block_size} tokens")

    rng = np.random.default_rng(0)
    system_prompt = rng.integers(0, 32000, size=3 * block_size + 5).tolist()
    for seq_id in range(4):
        question = rng.integers(0, 32000, size=20).tolist()
        prompt = system_prompt + question
        cached = manager.add_sequence(seq_id, prompt)
        slots, _ = manager.allocate_slots(seq_id, len(prompt) - cached)
        print(f"request {seq_id}: {len(prompt)} prompt tokens, {cached} reused from the prefix cache, "
              f"{len(slots)} computed; block table {manager.block_table(seq_id)}")
    # Decode 8 tokens for all four requests, one batched call per step.
    ids = np.arange(4, dtype=np.int64)
    slots = np.empty(4, dtype=np.int32)
    for _ in range(8):
        manager.append_decode(ids, rng.integers(0, 32000, size=4).astype(np.int32), slots)
    print("after 8 decode steps:", manager.stats())
    for seq_id in range(4):
        manager.free(seq_id)
    stats = manager.stats()
    print(f"all freed: {stats}; prefix hit rate {stats.hit_rate:.0%}")


if __name__ == "__main__":
    main()
