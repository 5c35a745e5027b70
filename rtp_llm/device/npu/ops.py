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
from rtp_llm.device.torch_ops import TorchLinear, TorchOps

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
        # resolved now, not at the first sampled step: ASCEND_CUSTOM_OPP_PATH may name another package only
        missing = torch.ops.rtp_llm_npu.missing_op_api_symbols("aclnnApplyTopKTopPCustom")
    except (OSError, RuntimeError) as exc:
        log.warning("cannot load %s (%s); using torch_npu.npu_top_k_top_p", lib, exc)
        return None
    if missing:
        log.warning("ASCEND_CUSTOM_OPP_PATH=%s has no package defining %s (rtp-llm's package is not installed "
                    "there); using torch_npu.npu_top_k_top_p", os.environ["ASCEND_CUSTOM_OPP_PATH"],
                    ", ".join(missing))
        return None
    return torch.ops.rtp_llm_npu.apply_top_k_top_p_custom


class NpuOps(TorchOps):
    name = "npu"
    # GGUF formats kept quantized (npu_weight_quant_batchmatmul through QuantizedWeight.int_groups: Q6_K's 16-element
    # sub-blocks are below the op's smallest group), with the op's activation dtypes.
    quantized_formats = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K")
    quantized_dtypes = (torch.bfloat16,)

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
        moe.prepare(block)  # the model is bfloat16 (NpuDevice.DTYPES), the dtype npu_moe_token_unpermute takes

    def route(self, logits, top_k, renormalize, weights_dtype):
        return moe.route(self.torch_npu, logits, top_k, renormalize, weights_dtype)

    def moe_experts(self, h, weights, ids, block):
        return moe.experts(self.torch_npu, h, weights, ids, block.npu_experts)

    def rms_norm(self, x, weight, eps):
        return self.torch_npu.npu_rms_norm(x, weight, eps)[0]

    # AddRmsNorm's tiling picks its kernel by rows per vector core; above this hidden size a bf16 batch with more rows
    # than cores gets the kernel that normalises the unrounded float32 sum, a smaller batch the rounded one (ops-nn
    # add_rms_norm_tiling.cpp, SMALL_REDUCE_NUM): a row's output would depend on the batch.
    FUSED_ADD_RMS_NORM_MAX_HIDDEN = 2000

    def add_rms_norm(self, x, residual, weight, eps):
        if x.dtype == torch.bfloat16 and -(-x.shape[-1] // 16) * 16 > self.FUSED_ADD_RMS_NORM_MAX_HIDDEN:
            s = x + residual  # rounded to bf16 once, as the fused kernel writes its x
            return self.rms_norm(s, weight, eps), s
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

    def top_k_top_p(self, logits, k, p):
        """Every row in one call, nothing copied to the host: aclnnApplyTopKTopP (behind npu_top_k_top_p) treats
        k <= 0 or k >= vocab as no top-k (ops-nn's docs and kernel; op-plugin's binding adds no range check), which is
        the sampler's "vocab or more = off". k: [R], p: [R] (1 = off)."""
        if k is None and p is None:
            return logits
        return self._op(logits, p, k)

    def _op(self, logits, p, k):
        p = None if p is None else p.to(logits.dtype)
        k = None if k is None else k.to(torch.int32)
        if self.custom_top_k_top_p is not None:
            return self.custom_top_k_top_p(logits, p, k)
        return self.torch_npu.npu_top_k_top_p(logits, p, k)
