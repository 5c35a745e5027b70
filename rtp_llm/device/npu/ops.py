"""The model graph's fused ops on Ascend, through torch_npu (semantics: docs/ascend.md and tests/npu_emulator).

top-k/top-p runs on the device: the AscendC custom operator when its package is installed
(ASCEND_CUSTOM_OPP_PATH), else torch_npu.npu_top_k_top_p. Logits never go to the host.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F

from rtp_llm.device.npu import moe
from rtp_llm.device.npu.quant_linear import NpuQuantLinear
from rtp_llm.device.torch_ops import TorchLinear, TorchOps, apply_top_k_top_p

log = logging.getLogger(__name__)


def load_custom_top_k_top_p():
    """torch.ops.rtp_llm_npu.apply_top_k_top_p_custom when this project's operator package is installed
    (ASCEND_CUSTOM_OPP_PATH set) and rtp_llm/_npu_ops.so is built; otherwise None (with the reason logged)."""
    if not os.environ.get("ASCEND_CUSTOM_OPP_PATH"):
        return None
    lib = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "_npu_ops.so")
    if not os.path.exists(lib):
        log.warning("ASCEND_CUSTOM_OPP_PATH is set but %s is not built (bazel build --config=ascend "
                    "//rtp_llm:_npu_ops.so); using torch_npu.npu_top_k_top_p", lib)
        return None
    try:
        torch.ops.load_library(lib)
        return torch.ops.rtp_llm_npu.apply_top_k_top_p_custom
    except (OSError, RuntimeError) as exc:
        log.warning("cannot load %s (%s); using torch_npu.npu_top_k_top_p", lib, exc)
        return None


class NpuOps(TorchOps):
    name = "npu"
    # GGUF formats kept quantized (npu_weight_quant_batchmatmul through QuantizedWeight.int_groups: Q6_K's 16-element
    # sub-blocks are below the op's smallest group), with the op's activation dtypes.
    quantized_formats = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K")
    quantized_dtypes = (torch.bfloat16, torch.float16)

    def __init__(self):
        import torch_npu

        self.torch_npu = torch_npu
        self.custom_top_k_top_p = load_custom_top_k_top_p()

    def prepare_linears(self, linears, head) -> None:
        super().prepare_linears(linears, head)
        kept, dense = [], []
        for lin in [lin for lin in list(linears) + [head] if lin is not None and lin.quantized is not None]:
            try:  # a head tied to the embedding stays int8: the embedding's row lookups read the same tensors
                lin.kernel = self._quant_kernel(lin.quantized, lin.weight, pack_int4=not (lin is head and head.tied))
                kept.append(lin)
            except ValueError as exc:
                dense.append(f"{lin.quantized.format} {lin.quantized.shape} ({exc})")
                self._densify(lin.quantized, lin.weight)
                lin.quantized = None
                lin.kernel = TorchLinear(lin.weight)
        if kept:
            log.info("npu: %d matrices kept quantized for npu_weight_quant_batchmatmul (%s), %.1f MB on the device",
                     len(kept), ", ".join(sorted({f"{lin.quantized.format} as int{4 if lin.kernel.int4 else 8}"
                                                  for lin in kept})),
                     sum(lin.kernel.nbytes for lin in kept) / 1e6)
        if dense:
            log.info("npu: dequantized at load: %s", "; ".join(dense))

    def _quant_kernel(self, quantized, like, pack_int4: bool) -> NpuQuantLinear:
        return NpuQuantLinear(self.torch_npu, quantized.int_groups(), like.dtype, like.device, pack_int4)

    @staticmethod
    def _densify(quantized, param) -> None:
        param.data = quantized.dequantize().to(param.dtype).to(param.device)

    def quantized_embedding(self, quantized, tied_head, like):
        if tied_head is not None:
            if isinstance(tied_head.kernel, NpuQuantLinear):
                return tied_head.kernel.rows
            return lambda ids: F.embedding(ids, like)  # the head fell back to dense: `like` holds the weight
        try:
            return self._quant_kernel(quantized, like, pack_int4=False).rows
        except ValueError:
            self._densify(quantized, like)
            return lambda ids: F.embedding(ids, like)

    def prepare_moe(self, block) -> None:
        if block.router.weight.dtype in moe.UNPERMUTE_DTYPES:
            moe.prepare(block)

    def route(self, logits, top_k, renormalize, weights_dtype):
        return moe.route(self.torch_npu, logits, top_k, renormalize, weights_dtype)

    def moe_experts(self, h, weights, ids, block):
        if getattr(block, "npu_experts", None) is None:  # float16 models: the expert loop on torch ops
            return super().moe_experts(h, weights, ids, block)
        return moe.experts(self.torch_npu, h, weights, ids, block.npu_experts)

    def rms_norm(self, x, weight, eps):
        return self.torch_npu.npu_rms_norm(x, weight, eps)[0]

    def add_rms_norm(self, x, residual, weight, eps):
        y, _, s = self.torch_npu.npu_add_rms_norm(x, residual, weight, eps)
        return y, s

    def rotary(self, q, k, cos, sin):
        # npu_rotary_mul takes 4-D tensors: [1, T, heads, D] with cos/sin [1, T, 1, D].
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        q = self.torch_npu.npu_rotary_mul(q.unsqueeze(0), c, s, rotary_mode="half").squeeze(0)
        k = self.torch_npu.npu_rotary_mul(k.unsqueeze(0), c, s, rotary_mode="half").squeeze(0)
        return q, k

    def silu_and_mul(self, gate_up):
        return self.torch_npu.npu_swiglu(gate_up, dim=-1)

    # npu_top_k_top_p takes k in [1, 1024] (torch_npu 2.13 docs): no "k = vocab" for rows without top-k.
    MAX_K = 1024

    def top_k_top_p(self, logits, k, p):
        """Rows go to the operator in the documented ranges: rows with top-k (k <= 1024) with their k, rows without
        it with k = None (top-p alone), rows with a larger k through the reference algorithm in torch ops; the
        results are put back in row order. k: [R] (vocab or more = off), p: [R] (1 = off)."""
        if k is None and p is None:
            return logits
        if k is None:
            return self._op(logits, p, None)
        vocab = logits.shape[-1]
        k_host = k.cpu()  # R ints; the logits stay on the device
        off = k_host >= vocab
        big = (k_host > self.MAX_K) & ~off
        if not off.any() and not big.any():
            return self._op(logits, p, k)
        out = torch.empty_like(logits)
        for rows, kind in ((~off & ~big, "k"), (off, "p"), (big, "ref")):
            if not rows.any():
                continue
            idx = torch.nonzero(rows).flatten().to(logits.device)
            rows_logits = logits.index_select(0, idx)
            sub_p = None if p is None else p.index_select(0, idx)
            if kind == "k":
                part = self._op(rows_logits, sub_p, k.index_select(0, idx))
            elif kind == "p":
                part = rows_logits if sub_p is None else self._op(rows_logits, sub_p, None)
            else:
                part = apply_top_k_top_p(rows_logits, k.index_select(0, idx), sub_p)
            out.index_copy_(0, idx, part)
        return out

    def _op(self, logits, p, k):
        p = None if p is None else p.to(logits.dtype)
        k = None if k is None else k.to(torch.int32)
        if self.custom_top_k_top_p is not None:
            return self.custom_top_k_top_p(logits, p, k)
        return self.torch_npu.npu_top_k_top_p(logits, p, k)
