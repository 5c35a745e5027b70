"""cpu: the CPU attention backend. Rows of decodes and of short chunks (at most PAGED_MAX_Q new tokens: a
prefill's suffix after a cached prefix, a short prompt) go through the C++ paged attention kernel
(rtp_llm/cpp/cpu/paged_attention.cc) one query at a time, each with its own causal KV length, reading K/V in
place through the block table. Longer prefills (fresh prompts, suffixes after a cached prefix, prefill chunks;
any lengths in one call) go through the C++ prefill kernel (rtp_llm/cpp/cpu/prefill_attention.cc) on CPUs with
AVX-512, head_dim a multiple of 16 and float32 / bfloat16, also through the block table, with the paged kernel's
bits; elsewhere through the paged kernel too. Either way a row's result depends only on its own sequence, never on
its chunk, its batch or whether its prefix was cached. A mixed batch runs both kernels on their rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from rtp_llm._native import ops
from rtp_llm.device.attention import TorchRefAttention
from rtp_llm.device.forward_batch import ForwardBatch


@dataclass
class PrefillSeqs:
    """The longer prefills' sequences for the prefill kernel."""
    table: torch.Tensor                        # [S, W] int32 block tables
    starts: torch.Tensor                       # [S + 1] int64: each sequence's first row among the prefill rows
    kv_lens: torch.Tensor                      # [S] int64
    rows: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # per row: (table, causal length), built on first use

    def paged(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's block table and causal KV length, for the paged kernel (a dtype the prefill kernel lacks)."""
        if self.rows is None:
            n = (self.starts[1:] - self.starts[:-1]).numpy()
            seq, lens = CpuAttention._paged_rows(n, self.kv_lens.tolist(), np.arange(len(n)))
            self.rows = self.table[torch.from_numpy(seq)].contiguous(), torch.from_numpy(lens)
        return self.rows


@dataclass
class CpuMeta:
    slots: torch.Tensor
    all_paged: bool                            # every row goes through the paged kernel
    paged_rows: Optional[torch.Tensor] = None  # flat token rows for the paged kernel (None: all or none)
    paged_table: Optional[torch.Tensor] = None  # [rows, W] int32: each such row's block table
    paged_lens: Optional[torch.Tensor] = None  # [rows] int64: the keys each such row sees (causal)
    prefill_rows: Optional[torch.Tensor] = None  # flat token rows of longer prefills (None: all or none)
    prefill: Optional[PrefillSeqs] = None  # present only where the prefill kernel fits the CPU and head_dim


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
        # The C++ prefill kernel needs AVX-512 (RTP_LLM_CPU_NO_AVX512=1: every row paged); tests turn it off.
        self.prefill_kernel = self.kernels.cpu_isa() == "avx512"

    def prepare(self, batch: ForwardBatch) -> CpuMeta:
        q_lens = batch.q_lens
        slots = batch.slot_mapping.to(torch.int64)
        if max(q_lens) == 1:  # decodes only: one row per sequence, the batch's own table and lengths
            return CpuMeta(slots, all_paged=True, paged_table=batch.block_table,
                           paged_lens=torch.tensor(batch.kv_lens, dtype=torch.int64))
        q = np.asarray(q_lens, dtype=np.int64)
        # Without the prefill kernel every row takes the paged kernel too: it gives a row the bits it gets as a
        # decode (SDPA's would depend on the chunk and the batch).
        paged = q <= self.PAGED_MAX_Q if self._prefill_kernel_fits() else np.ones(len(q), dtype=bool)
        if paged.all():
            seq, lens = self._paged_rows(q, batch.kv_lens, np.arange(len(q)))
            return CpuMeta(slots, all_paged=True, paged_table=batch.block_table[torch.from_numpy(seq)],
                           paged_lens=torch.from_numpy(lens))
        if not paged.any():
            return CpuMeta(slots, all_paged=False, prefill=self._prefill_seqs(batch, np.arange(len(q))))
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
        table = batch.block_table[torch.from_numpy(seqs)].contiguous()
        return PrefillSeqs(table, torch.from_numpy(np.concatenate([[0], np.cumsum(q)])),
                           torch.tensor(kv_lens, dtype=torch.int64))

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
        table, lens = p.paged()
        return self.kernels.paged_attention(q.contiguous(), layer_kv[0], layer_kv[1], table, lens, self.scale)
