"""cpu: the CPU backend. Decode rows (one new token) go through the C++ paged decode kernel
(rtp_llm/cpp/ops/paged_decode_attention.cc), which reads K/V in place through the block table;
prefill rows (and prefill chunks) use the reference path's scaled-dot-product attention, whose
blocked GEMMs are faster for many queries. A mixed batch runs both on their rows."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import torch
import torch.nn.functional as F

from rtp_llm._native import ops
from rtp_llm.layers.attention.torch_ref import RefMeta, TorchRefAttention
from rtp_llm.models.forward_batch import ForwardBatch


@dataclass
class CpuMeta:
    slots: torch.Tensor
    decode_rows: Optional[torch.Tensor]        # flat token rows of decode sequences (None: all or none)
    decode_table: Optional[torch.Tensor]       # [Bd, W] int32
    decode_lens: Optional[torch.Tensor]        # [Bd] int64
    prefill_rows: Optional[torch.Tensor]       # flat token rows of prefill sequences (None: all or none)
    prefill: Optional[RefMeta]
    all_decode: bool
    uniform_fresh: int = 0  # > 0: that many fresh prompts of equal length, nothing cached (causal SDPA as is)


class CpuAttention(TorchRefAttention):
    name = "cpu"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernels = ops()

    def prepare(self, batch: ForwardBatch) -> CpuMeta:
        q_lens = batch.q_lens
        dec = [i for i, q in enumerate(q_lens) if q == 1]
        slots = batch.slot_mapping.to(torch.int64)
        if len(dec) == len(q_lens):
            return CpuMeta(slots, None, batch.block_table, torch.tensor(batch.kv_lens, dtype=torch.int64),
                           None, None, True)
        if not dec:
            if len(set(q_lens)) == 1 and list(batch.kv_lens) == list(q_lens):
                # Fresh prompts of one length (offline batches, benchmarks): their keys and values are the
                # step's own k and v, so SDPA runs causal on them directly, without the general path's
                # cache gather and explicit mask (whose meta is still built: the fallback when the KV cache
                # has another dtype than q and its rounding must be read back).
                return CpuMeta(slots, None, None, None, None, super().prepare(batch), False,
                               uniform_fresh=len(q_lens))
            # prefills only: the reference path on the whole batch, no row gather/scatter
            return CpuMeta(slots, None, None, None, None, super().prepare(batch), False)
        starts = [0]
        for q in q_lens[:-1]:
            starts.append(starts[-1] + q)
        pre = [i for i in range(len(q_lens)) if q_lens[i] != 1]
        prefill_rows = torch.tensor([r for i in pre for r in range(starts[i], starts[i] + q_lens[i])])
        sub = SimpleNamespace(input_ids=batch.input_ids, q_lens=[q_lens[i] for i in pre],
                              kv_lens=[batch.kv_lens[i] for i in pre], block_size=batch.block_size,
                              block_table=batch.block_table[torch.tensor(pre)], slot_mapping=batch.slot_mapping)
        return CpuMeta(slots, torch.tensor([starts[i] for i in dec]), batch.block_table[torch.tensor(dec)].contiguous(),
                       torch.tensor([batch.kv_lens[i] for i in dec], dtype=torch.int64), prefill_rows,
                       super().prepare(sub), False)

    def forward(self, q, k, v, layer_kv, meta: CpuMeta):
        self.write_kv(k, v, layer_kv, meta.slots)
        if meta.all_decode:
            return self.kernels.paged_decode_attention(q.contiguous(), layer_kv[0], layer_kv[1], meta.decode_table,
                                                       meta.decode_lens, self.scale)
        if meta.uniform_fresh and layer_kv.dtype == q.dtype:  # else the cache's rounding must be read back
            b = meta.uniform_fresh
            qb, kb, vb = (x.reshape(b, -1, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
            out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=self.scale,
                                                 enable_gqa=self.num_heads != self.num_kv_heads)
            return out.transpose(1, 2).reshape(q.shape)
        if meta.prefill_rows is None:
            return self.attend(q, layer_kv, meta.prefill)
        out = torch.empty_like(q)
        out[meta.decode_rows] = self.kernels.paged_decode_attention(
            q[meta.decode_rows].contiguous(), layer_kv[0], layer_kv[1], meta.decode_table, meta.decode_lens,
            self.scale)
        out[meta.prefill_rows] = self.attend(q[meta.prefill_rows], layer_kv, meta.prefill)
        return out
