"""Ascend attention: torch_npu cache writes + npu_fused_infer_attention_score (FIA) on the merged cache.

Every step, prefill, prefill chunks, prefix-cache hits and decodes go through ONE FIA call in TND
layout over the paged cache (as vllm-ascend's cache-hit / decode path does):
  - query [T, N, D]; actual_seq_lengths = cumulative Q lengths, no leading 0, ending at T;
  - key/value = the layer's K and V views reshaped to BnBsH (num_blocks, block_size, KV_N*D): plain
    views of the one KV allocation, never permuted or made contiguous per call;
  - block_table: the step's 2-D int32 table, already on the device;
  - actual_seq_lengths_kv = per-sequence total KV lengths (cached + new, NOT cumulative: the token
    written this step is included, which avoids the decode off-by-one), one per sequence;
  - sparse_mode=3 (causal, anchored bottom-right) with one cached 2048x2048 int8 template mask;
  - scale = 1/sqrt(head_dim), num_key_value_heads for GQA.
New K/V are written first with npu_scatter_pa_kv_cache(cache_mode="Norm") (default) or
_npu_reshape_and_cache, into the same ND [num_blocks, block_size, KV_N, D] views FIA reads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from rtp_llm.device.attention import AttentionBackend
from rtp_llm.device.forward_batch import ForwardBatch

CACHE_WRITERS = ("scatter_pa", "reshape_and_cache")


@dataclass
class AscendMeta:
    q_cum: list[int]        # host list, cumulative
    kv_lens: list[int]      # host list, per sequence
    block_table: torch.Tensor
    slots: torch.Tensor     # int32 [T]


class AscendAttention(AttentionBackend):
    name = "ascend"

    def __init__(self, num_heads, num_kv_heads, head_dim, scale, block_size, cache_writer: str = "scatter_pa"):
        super().__init__(num_heads, num_kv_heads, head_dim, scale, block_size)
        import torch_npu

        if cache_writer not in CACHE_WRITERS:
            raise ValueError(f"cache_writer must be one of {CACHE_WRITERS}, got {cache_writer!r}")
        self.torch_npu = torch_npu
        self.cache_writer = cache_writer
        self._mask = None

    def _template_mask(self, device) -> torch.Tensor:
        if self._mask is None or self._mask.device != device:
            self._mask = torch.triu(torch.ones(2048, 2048, dtype=torch.int8, device=device), diagonal=1)
        return self._mask

    def prepare(self, batch: ForwardBatch) -> AscendMeta:
        # int32 slots: what _npu_reshape_and_cache takes (ATB) and npu_scatter_pa_kv_cache accepts, once per step
        return AscendMeta(list(itertools.accumulate(batch.q_lens)), list(batch.kv_lens), batch.block_table,
                          batch.slot_mapping.to(torch.int32))

    def forward(self, q, k, v, layer_kv, meta: AscendMeta):
        k_cache, v_cache = layer_kv[0], layer_kv[1]        # [nb, bs, KV_N, D] views of the one buffer
        # split() hands back strided views: the NEW tokens' K/V are made contiguous, never the cache.
        k, v = k.contiguous(), v.contiguous()
        if self.cache_writer == "scatter_pa":
            self.torch_npu.npu_scatter_pa_kv_cache(k, v, k_cache, v_cache, meta.slots, cache_mode="Norm")
        else:
            self.torch_npu._npu_reshape_and_cache(k, v, k_cache, v_cache, meta.slots)
        nb, bs = k_cache.shape[0], k_cache.shape[1]
        out, _ = self.torch_npu.npu_fused_infer_attention_score(
            q.contiguous(), k_cache.view(nb, bs, -1), v_cache.view(nb, bs, -1),
            atten_mask=self._template_mask(q.device), actual_seq_lengths=meta.q_cum,
            actual_seq_lengths_kv=meta.kv_lens, block_table=meta.block_table, num_heads=self.num_heads,
            scale=self.scale, input_layout="TND", num_key_value_heads=self.num_kv_heads, sparse_mode=3,
            block_size=bs)
        return out
