"""A GGUF matrix kept quantized on the NPU: torch_npu.npu_weight_quant_batchmatmul (aclnnWeightQuantBatchMatmulV2,
y = x @ ((w + antiquant_offset) * antiquant_scale) + bias) over the integer-and-group form of the blocks
(QuantizedWeight.int_groups: a scale and an offset per 32 columns, in the model's dtype as the op requires).

Weights whose integers fit 4 bits (Q4_0, Q4_1, Q4_K) are packed by npu_convert_weight_to_int4pack (int32 carrying
8 int4), the others are int8. The weight is passed transposed ([N, K] contiguous seen as (K, N)), as the docs
recommend; the op takes K and N up to 65535, so a larger output dimension (a big vocabulary's LM head) runs in
slices of rows. An embedding lookup reads int8 rows and applies the same (q + offset) * scale. A matrix the op cannot
take (K > 65535, a scale or offset beyond the dtype's range) raises ValueError: NpuOps keeps it dense.
"""

from __future__ import annotations

import torch

GROUP = 32          # QuantizedWeight.int_groups' group: the op's smallest per-group size
MAX_DIM = 65535     # K and N of npu_weight_quant_batchmatmul are in [1, 65535]


class NpuQuantLinear:
    def __init__(self, torch_npu, groups, dtype: torch.dtype, device, pack_int4: bool = True):
        """groups: an IntGroups (rtp_llm/models/int_groups.py) on the host."""
        n, k = groups.q.shape
        if k > MAX_DIM:
            raise ValueError(f"npu_weight_quant_batchmatmul takes K <= {MAX_DIM}, this weight has K = {k}")
        self.torch_npu, self.dtype = torch_npu, dtype
        self.out_features, self.in_features = n, k
        # One group spanning all of K is the per-channel case (the op wants group sizes in [32, K - 1]).
        self.group_size = GROUP if k > GROUP else 0
        self.int4 = pack_int4 and groups.bits == 4
        scale = groups.scale.to(dtype)
        offset = None if groups.offset is None else groups.offset.to(dtype)
        if not bool(torch.isfinite(scale).all()) or (offset is not None and not bool(torch.isfinite(offset).all())):
            # float16 overflows m / d where a block's minimum dwarfs its step
            raise ValueError(f"a group's scale or offset does not fit {dtype}")
        self.scale = scale.to(device)
        self.offset = None if offset is None else offset.to(device)
        q = groups.q.to(device)
        self.q_rows = None if self.int4 else q  # int8 rows, for an embedding lookup
        self.slices = []  # (start, stop, weight) per <= MAX_DIM output rows
        for start in range(0, n, MAX_DIM):
            stop = min(n, start + MAX_DIM)
            w = q[start:stop]
            if self.int4:
                w = torch_npu.npu_convert_weight_to_int4pack(w.to(torch.int32).contiguous())  # (rows, K / 8)
            self.slices.append((start, stop, w))

    @property
    def nbytes(self) -> int:
        n = sum(w.numel() * w.element_size() for _, _, w in self.slices)
        return n + sum(t.numel() * t.element_size() for t in (self.scale, self.offset) if t is not None)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is not None:  # [docs] bias: float32 with bfloat16 x, float16 with float16 x
            bias = bias.float() if x.dtype == torch.bfloat16 else bias
        outs = []
        for start, stop, w in self.slices:
            offset = None if self.offset is None else self.offset[start:stop].t()
            outs.append(self.torch_npu.npu_weight_quant_batchmatmul(
                x, w.t(), self.scale[start:stop].t(), offset,
                bias=None if bias is None else bias[start:stop].contiguous(),
                antiquant_group_size=self.group_size))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` as the matmul sees them: (q + offset) * scale in float32, rounded once to the model's dtype."""
        flat = ids.reshape(-1)
        scale = self.scale.index_select(0, flat).float().repeat_interleave(GROUP, dim=1)
        w = self.q_rows.index_select(0, flat).float()
        if self.offset is not None:
            w = w + self.offset.index_select(0, flat).float().repeat_interleave(GROUP, dim=1)
        return (w * scale).to(self.dtype).reshape(*ids.shape, -1)
