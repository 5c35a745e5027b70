"""cpu: the CPU attention backend. Rows of decodes and of short chunks (at most PAGED_MAX_Q new tokens: a
prefill's suffix after a cached prefix, a short prompt) go through the C++ paged attention kernel
(rtp_llm/cpp/cpu/paged_attention.cc) one query at a time, each with its own causal KV length, reading K/V in
place through the block table. Longer prefills (fresh prompts, suffixes after a cached prefix, prefill chunks;
any lengths in one call) go through the C++ prefill kernel (rtp_llm/cpp/cpu/prefill_attention.cc) on CPUs with
AVX-512, head_dim a multiple of 16 and the cache in q's dtype, also through the block table; elsewhere through
the reference backend's scaled-dot-product attention. A mixed batch runs both kinds on their rows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from rtp_llm._native import ops
from rtp_llm.device.attention import RefMeta, TorchRefAttention
from rtp_llm.device.forward_batch import ForwardBatch


@dataclass
class PrefillSeqs:
    """The longer prefills' sequences for the prefill kernel, and how to build the reference path's meta."""
    table: torch.Tensor                        # [S, W] int32 block tables
    starts: torch.Tensor                       # [S + 1] int64: each sequence's first row among the prefill rows
    kv_lens: torch.Tensor                      # [S] int64
    sub_batch: ForwardBatch                    # the same sequences as a batch, for TorchRefAttention.prepare
    ref: Optional[RefMeta] = None              # built on first use (the fallback paths)


@dataclass
class CpuMeta:
    slots: torch.Tensor
    all_paged: bool                            # every row goes through the paged kernel
    paged_rows: Optional[torch.Tensor] = None  # flat token rows for the paged kernel (None: all or none)
    paged_table: Optional[torch.Tensor] = None  # [rows, W] int32: each such row's block table
    paged_lens: Optional[torch.Tensor] = None  # [rows] int64: the keys each such row sees (causal)
    prefill_rows: Optional[torch.Tensor] = None  # flat token rows of longer prefills (None: all or none)
    prefill: Optional[PrefillSeqs] = None
    uniform_fresh: int = 0  # > 0: that many fresh prompts of equal length, nothing cached (causal SDPA as is)
    # the C++ prefill kernel serves this CPU and head_dim (for a cache in q's dtype, float32 or bfloat16)
    prefill_kernel: bool = False


class CpuAttention(TorchRefAttention):
    name = "cpu"

    # Up to this many new tokens a sequence's rows are attended one by one by the paged kernel (row j of a
    # chunk of q new tokens over kv keys sees kv - q + j + 1 of them): the KV is re-read per row, which costs
    # less than the reference path's gather, mask and scatter for a handful of rows. A step whose rows are all
    # paged runs every layer in one C++ call (device/cpu/fused_layers.py).
    PAGED_MAX_Q = 8

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernels = ops()
        # The C++ prefill kernel needs AVX-512 (RTP_LLM_CPU_NO_AVX512=1 keeps SDPA); tests switch it off to compare.
        self.prefill_kernel = self.kernels.cpu_isa() == "avx512"

    def prepare(self, batch: ForwardBatch) -> CpuMeta:
        q_lens = batch.q_lens
        slots = batch.slot_mapping.to(torch.int64)
        if max(q_lens) == 1:  # decodes only: one row per sequence, the batch's own table and lengths
            return CpuMeta(slots, all_paged=True, paged_table=batch.block_table,
                           paged_lens=torch.tensor(batch.kv_lens, dtype=torch.int64))
        q = np.asarray(q_lens, dtype=np.int64)
        paged = q <= self.PAGED_MAX_Q
        if paged.all():
            seq, lens = self._paged_rows(q, batch.kv_lens, np.arange(len(q)))
            return CpuMeta(slots, all_paged=True, paged_table=batch.block_table[torch.from_numpy(seq)],
                           paged_lens=torch.from_numpy(lens))
        if not paged.any():
            prefill = self._prefill_seqs(batch, np.arange(len(q)))
            # Fresh prompts of one length (offline batches, benchmarks): where the prefill kernel does not
            # apply, SDPA runs causal on the step's own k and v, without the general path's gather and mask.
            fresh = len(set(q_lens)) == 1 and list(batch.kv_lens) == list(q_lens)
            return CpuMeta(slots, all_paged=False, prefill=prefill, uniform_fresh=len(q_lens) if fresh else 0,
                           prefill_kernel=self._prefill_kernel_fits())
        starts = np.cumsum(q) - q
        short, long_ = np.flatnonzero(paged), np.flatnonzero(~paged)
        seq, lens = self._paged_rows(q, batch.kv_lens, short)
        paged_rows = np.concatenate([np.arange(starts[i], starts[i] + q[i]) for i in short])
        prefill_rows = np.concatenate([np.arange(starts[i], starts[i] + q[i]) for i in long_])
        return CpuMeta(slots, all_paged=False, paged_rows=torch.from_numpy(paged_rows),
                       paged_table=batch.block_table[torch.from_numpy(seq)].contiguous(),
                       paged_lens=torch.from_numpy(lens), prefill_rows=torch.from_numpy(prefill_rows),
                       prefill=self._prefill_seqs(batch, long_))

    @staticmethod
    def _prefill_seqs(batch: ForwardBatch, seqs: np.ndarray) -> PrefillSeqs:
        q = np.asarray(batch.q_lens, dtype=np.int64)[seqs]
        kv_lens = [batch.kv_lens[i] for i in seqs]
        idx = torch.from_numpy(seqs)
        table = batch.block_table[idx].contiguous()
        sub = dataclasses.replace(batch, q_lens=q.tolist(), kv_lens=kv_lens, block_table=table)
        return PrefillSeqs(table, torch.from_numpy(np.concatenate([[0], np.cumsum(q)])),
                           torch.tensor(kv_lens, dtype=torch.int64), sub)

    @staticmethod
    def _paged_rows(q: np.ndarray, kv_lens, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the rows of sequences `seqs` (in flat order): each row's sequence and causal KV length."""
        n = q[seqs]
        seq = np.repeat(seqs, n)
        within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        lens = np.repeat(np.asarray(kv_lens, dtype=np.int64)[seqs] - n, n) + within + 1
        return seq, lens

    def write_kv(self, k, v, layer_kv, slots) -> None:
        # One memcpy per row (rtp_llm/cpp/cpu/kv_write.cc) instead of two index_puts.
        if k.dtype == v.dtype == layer_kv.dtype and layer_kv.is_contiguous():
            self.kernels.write_kv(k, v, layer_kv, slots)
        else:  # the cache in another dtype: rounded on the way in
            super().write_kv(k, v, layer_kv, slots)

    def forward(self, q, k, v, layer_kv, meta: CpuMeta):
        self.write_kv(k, v, layer_kv, meta.slots)
        if meta.all_paged:
            return self.kernels.paged_attention(q.contiguous(), layer_kv[0], layer_kv[1], meta.paged_table,
                                                       meta.paged_lens, self.scale)
        if meta.prefill_rows is None:
            if meta.uniform_fresh and not self._prefill_kernel(q, layer_kv) and layer_kv.dtype == q.dtype:
                b = meta.uniform_fresh
                qb, kb, vb = (x.reshape(b, -1, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
                out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=self.scale,
                                                     enable_gqa=self.num_heads != self.num_kv_heads)
                return out.transpose(1, 2).reshape(q.shape)
            return self._prefill(q, layer_kv, meta.prefill)
        # index_select / index_copy_, not q[rows] / out[rows] = ...: torch's advanced indexing wakes the OpenMP team
        # from a few thousand elements on, four calls per layer of a mixed step.
        out = torch.empty_like(q)
        out.index_copy_(0, meta.paged_rows, self.kernels.paged_attention(
            q.index_select(0, meta.paged_rows), layer_kv[0], layer_kv[1], meta.paged_table, meta.paged_lens,
            self.scale))
        out.index_copy_(0, meta.prefill_rows, self._prefill(q.index_select(0, meta.prefill_rows), layer_kv,
                                                            meta.prefill))
        return out

    def _prefill_kernel(self, q, layer_kv) -> bool:
        return q.dtype == layer_kv.dtype and q.dtype in (torch.float32, torch.bfloat16) and self._prefill_kernel_fits()

    def _prefill_kernel_fits(self) -> bool:
        return self.prefill_kernel and self.head_dim % 16 == 0

    def _prefill(self, q, layer_kv, p: PrefillSeqs):
        """Causal attention of the longer prefills' rows (q in their flat order) over their cached keys."""
        if self._prefill_kernel(q, layer_kv):
            return self.kernels.prefill_attention(q, layer_kv[0], layer_kv[1], p.table, p.starts, p.kv_lens,
                                                  self.scale)
        if p.ref is None:
            p.ref = TorchRefAttention.prepare(self, p.sub_batch)
        return self.attend(q, layer_kv, p.ref)
