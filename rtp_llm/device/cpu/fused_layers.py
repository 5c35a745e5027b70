"""Every decoder layer of a step in one C++ call (torch.ops.rtp_llm.paged_decoder_layers), for steps whose rows
all go through the paged attention kernel (decodes, and short chunks after a cached prefix: see
device/cpu/attention.py).

It runs the kernels the layers (rtp_llm/models/decoder.py on CpuOps) would call one by one, in the same order on
the same tensors, each linear layer through its own kernel (device/cpu/linear.py), so logits and KV cache are
bit-for-bit the same; what it saves is the ~18 Python-level torch calls per layer, during which the memory bus
idles at the batch sizes where a step is weight streaming. Not under tensor parallelism (no collectives in C++);
the KV cache in the model's dtype.
"""

from __future__ import annotations

import torch

FUSED_DTYPES = (torch.float32, torch.bfloat16)


def _linear_args(lin) -> tuple[list, list[int]]:
    k = lin.kernel
    return [k.plain, k.packed, lin.bias], [k.out_features, k.gemv_rows]


class PagedDecoderLayers:
    def __init__(self, kernels, layers, cfg):
        self.kernels = kernels
        self.enabled = True  # tests and benchmarks switch it off to compare with the layer-by-layer path
        first = layers[0]
        self.num_heads, self.num_kv_heads, self.eps = first.num_heads, first.num_kv_heads, cfg.rms_norm_eps
        self.dtype = first.qkv.weight.dtype
        linears = [lin for layer in layers for lin in (layer.qkv, layer.o, layer.mlp.gate_up, layer.mlp.down)]
        gated = {bool(getattr(layer.mlp.gate_up.kernel, "gated", False)) for layer in layers}
        # The C++ op knows only this module's kernels, no collectives, and gated gate_up in every layer or none.
        self.usable = (all(hasattr(lin.kernel, "gemv_rows") and lin.tp is None for lin in linears)
                       and len(gated) == 1)
        if not self.usable:
            return
        self.gated = gated.pop()
        self.weights: list = []
        self.sizes: list[int] = []
        for layer in layers:
            norms = [layer.q_norm.weight, layer.k_norm.weight] if layer.q_norm is not None else [None, None]
            qkv, qkv_n = _linear_args(layer.qkv)
            o, o_n = _linear_args(layer.o)
            gu, gu_n = _linear_args(layer.mlp.gate_up)
            down, down_n = _linear_args(layer.mlp.down)
            self.weights += [layer.input_norm.weight, *qkv, *norms, *o, layer.post_norm.weight, *gu, *down]
            self.sizes += qkv_n + o_n + gu_n + down_n

    def __call__(self, x, cos, sin, kv, meta, scale: float):
        """(x, residual) after the last layer, or None where the step does not qualify."""
        if not (self.enabled and self.usable and getattr(meta, "all_paged", False) and x.dtype in FUSED_DTYPES
                and kv.dtype == x.dtype == cos.dtype == self.dtype):
            return None
        return self.kernels.paged_decoder_layers(
            x.contiguous(), self.weights, self.sizes, kv.buffer, cos.contiguous(), sin.contiguous(), meta.slots,
            meta.paged_table, meta.paged_lens, self.num_heads, self.num_kv_heads, self.eps, scale, self.gated)
