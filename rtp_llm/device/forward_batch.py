"""ForwardBatch: one flat batch that may mix prefills, prefill chunks (with or without a cached
prefix) and decodes. Built once per step, read by every layer.

Sequence i contributes q_lens[i] new tokens at positions kv_lens[i] - q_lens[i] .. kv_lens[i] - 1;
its KV (cached prefix + new tokens) has kv_lens[i] tokens reachable through block_table[i].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor       # [T] int64
    positions: torch.Tensor       # [T] int64
    slot_mapping: torch.Tensor    # [T] int64: where each new token's K/V is written
    block_table: torch.Tensor     # [B, max_blocks] int32, padded with block 0
    q_lens: list[int]             # host: new tokens per sequence
    kv_lens: list[int]            # host: total KV length per sequence after this step
    logits_indices: torch.Tensor  # [R] int64, ascending: rows of the flat batch whose logits are computed
    block_size: int

    # Which rows of a sequence need logits: none, its last (to sample), or all (prompt logprobs; the last samples).
    LOGITS_NONE, LOGITS_LAST, LOGITS_ALL = 0, 1, 2

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def build(
        cls,
        tokens: Sequence[Sequence[int]],
        start_positions: Sequence[int],
        slots: Sequence[np.ndarray],
        block_table: np.ndarray,
        block_size: int,
        need_logits: Sequence[int] | None = None,
        device: torch.device | str = "cpu",
    ) -> "ForwardBatch":
        """tokens[i]: sequence i's new tokens, written at positions start_positions[i].. and slots[i].
        need_logits[i]: LOGITS_* (True/False read as last/none); None = every sequence's last row."""
        q_lens = [len(t) for t in tokens]
        if any(q == 0 for q in q_lens):
            raise ValueError("every sequence in a forward batch needs at least one new token")
        kv_lens = [s + q for s, q in zip(start_positions, q_lens)]
        if len(q_lens) == sum(q_lens):  # decodes: one token per sequence, no per-sequence arrays to join
            n = len(q_lens)
            flat = np.fromiter((t[0] for t in tokens), np.int64, n)
            pos = np.asarray(start_positions, dtype=np.int64)
            slot = np.fromiter((s[0] for s in slots), np.int64, n)
            ends = np.arange(n, dtype=np.int64)
        else:
            flat = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])
            pos = np.concatenate([np.arange(s, s + q, dtype=np.int64) for s, q in zip(start_positions, q_lens)])
            slot = np.concatenate([np.asarray(s, dtype=np.int64) for s in slots])
            ends = np.cumsum(q_lens) - 1
        if need_logits is not None:
            need = [int(x) for x in need_logits]
            if cls.LOGITS_ALL in need:
                ends = np.concatenate([np.arange(e - q + 1, e + 1) if k == cls.LOGITS_ALL else ends[i:i + int(k > 0)]
                                       for i, (e, q, k) in enumerate(zip(ends, q_lens, need))])
            else:
                ends = ends[np.asarray(need, dtype=bool)]
        return cls(
            input_ids=torch.from_numpy(flat).to(device),
            positions=torch.from_numpy(pos).to(device),
            slot_mapping=torch.from_numpy(slot).to(device),
            block_table=torch.from_numpy(np.ascontiguousarray(block_table, dtype=np.int32)).to(device),
            q_lens=q_lens,
            kv_lens=kv_lens,
            logits_indices=torch.from_numpy(ends.astype(np.int64)).to(device),
            block_size=block_size,
        )
