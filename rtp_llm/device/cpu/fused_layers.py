"""Every decoder layer of a step in one C++ call (torch.ops.rtp_llm.decoder_layers), for steps whose rows all go
through one attention kernel (device/cpu/attention.py): the paged kernel (decodes, short chunks after a cached
prefix) or the prefill kernel (fresh prompts, longer chunks, when nothing in the step is paged).

It runs the kernels the layers (rtp_llm/models/decoder.py on CpuOps) would call one by one, each linear layer
through its own kernel (device/cpu/linear.py), so logits and KV cache are bit-for-bit the same; what it saves is
the ~18 Python-level torch calls per layer, during which the memory bus idles at the batch sizes where a step is
weight streaming, and, for a prefill, the memory traffic of its intermediates: rows go through the norms, GEMMs,
RoPE and KV write in pieces of `piece_rows` that stay in cache. Pieces need kernels whose rows are independent
(panels, GGUF blocks: every kernel but oneDNN's and torch's); with others, prefills take the Python layers. Not
under tensor parallelism (no collectives in C++); the KV cache in the model's dtype. A step with LoRA adapter rows
runs here too: each linear layer's deltas through lora_add_, the kernel LinearLoRA.add calls.
"""

from __future__ import annotations

import torch

from rtp_llm.device.cpu.attention import CpuMeta

FUSED_DTYPES = (torch.float32, torch.bfloat16)


def _slot(layer, name: str):
    """One of the C++ op's weight slots ("post_norm", "qkv.packed", ...) from the layer's named parts."""
    part_name, _, field = name.partition(".")
    part = layer.part(part_name)
    if not field:  # a norm's weight; None where the model has no such norm
        return None if part is None else part.weight
    return part.bias if field == "bias" else getattr(part.kernel, field)


def _gated_tiles(tiles: torch.Tensor, inter: int) -> torch.Tensor:
    """A gate_up adapter's packed tiles (CpuOps.lora_pack) with their y columns in gated panels' order (per block of
    24: gate, then up), so that its deltas add to the gated GEMM's output before silu_and_mul_gated. A tile starts
    8k columns into gate or up and holds at most 8, so it stays inside one block of 24."""
    col = tiles[:, 3]
    up = col >= inter
    c = col - up * inter
    out = tiles.clone()
    out[:, 3] = (c // 24) * 48 + up * 24 + c % 24
    return out


def _rows_independent(kernel) -> bool:
    """Panels and GGUF blocks give a row the same bits whatever the rows beside it (and keep no plain weight for
    the GEMV kernel); oneDNN's and torch's GEMMs choose their blocking by row count."""
    return kernel.plain is None and kernel.packed is not None and not kernel.packed.is_mkldnn


class FusedDecoderLayers:
    def __init__(self, kernels, layers, cfg, piece_rows: int):
        self.kernels = kernels
        self.enabled = True  # tests and benchmarks switch it off to compare with the layer-by-layer path
        self.piece_rows = piece_rows
        first = layers[0]
        self.num_heads, self.num_kv_heads, self.eps = first.num_heads, first.num_kv_heads, cfg.rms_norm_eps
        self.dtype = first.qkv.weight.dtype
        linears = [lin for layer in layers for lin in layer.linears()]
        gated = {bool(getattr(layer.mlp.gate_up.kernel, "gated", False)) for layer in layers}
        # The C++ op knows only this module's kernels, no collectives, gated gate_up in every layer or none, and
        # float32 / bfloat16 activations with the KV cache in the same dtype.
        self.usable = (all(hasattr(lin.kernel, "gemv_rows") and lin.tp is None for lin in linears)
                       and len(gated) == 1 and self.dtype in FUSED_DTYPES)
        if not self.usable:
            return
        self.rows_independent = all(_rows_independent(lin.kernel) for lin in linears)
        self.gated = gated.pop()
        slots, names = kernels.decoder_layer_slots(), kernels.decoder_layer_linears()
        self.layers, self.linear_names = layers, names
        self._lora = ((), [])  # (the groups' slots and the adapters' install count, their weights) of a step
        self.weights = [_slot(layer, name) for layer in layers for name in slots]
        self.sizes = [n for layer in layers for name in names
                      for n in (layer.part(name).kernel.out_features, layer.part(name).kernel.gemv_rows)]

    def runs(self, meta) -> bool:
        """Whether this step's layers run here: its rows all go through one attention kernel the op calls (every
        row paged, or every row a prefill on the prefill kernel with row-independent linear kernels); a step's
        LoRA deltas run here whatever the step."""
        if not (self.enabled and self.usable and isinstance(meta, CpuMeta)):  # another attention backend's step
            return False
        return meta.all_paged or (meta.prefill_rows is None and self.rows_independent)

    def __call__(self, x, cos, sin, kv, meta, scale: float, lora=None):
        """(x, residual) after the last layer; only for a step that runs() accepts. lora: the step's LoRAContext
        when it has adapter rows."""
        pieces = self.piece_rows if self.rows_independent else 0
        rows, lora_w = [], []
        if lora is not None and lora.active:
            rows = [r for _, r in lora.groups]
            lora_w = self._lora_args(lora)
        if meta.all_paged:
            table, lens, starts = meta.paged_table, meta.paged_lens, None
        else:
            table, lens, starts = meta.prefill.table, meta.prefill.kv_lens, meta.prefill.starts
        return self.kernels.decoder_layers(
            x.contiguous(), self.weights, self.sizes, kv.buffer, cos.contiguous(), sin.contiguous(), meta.slots,
            table, lens, starts, self.num_heads, self.num_kv_heads, self.eps, scale, self.gated, pieces,
            rows, lora_w)

    def _lora_args(self, ctx) -> list:
        """Each (layer, linear, group)'s packed adapter weights (None, None, None where it has none): made again only
        when the groups' slots or the installed adapters change."""
        key = (tuple(slot for slot, _ in ctx.groups), ctx.installs)
        if key != self._lora[0]:
            weights = []
            for layer in self.layers:
                for name in self.linear_names:
                    adapters = layer.part(name).lora
                    for slot, _ in ctx.groups:
                        packed = adapters.slots.get(slot) if adapters is not None else None
                        if packed is not None and name == "gate_up" and self.gated:
                            packed = (*packed[:2], _gated_tiles(packed[2], adapters.out_features // 2))
                        weights += list(packed) if packed is not None else [None, None, None]
            self._lora = (key, weights)
        return self._lora[1]
