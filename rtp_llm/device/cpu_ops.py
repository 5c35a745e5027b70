"""The CPU's fused-op set: torch ops, except
- top-k/top-p: the C++ twin of the operator (rtp_llm/cpp/ops/top_k_top_p.cc), bit-identical masks
  without sorting the vocabulary (benchmarks/top_k_top_p.py);
- linear layers and the LM head on <= 4 rows (batch-1 / small-batch decode): a weight-streaming GEMV
  kernel (rtp_llm/cpp/ops/skinny_linear.cc), about 2.6x the BLAS call on the LM head here."""

import torch

from rtp_llm.layers.ops import TorchOps


class CpuOps(TorchOps):
    name = "cpu"

    def __init__(self):
        from rtp_llm._native import ops

        self._kernels = ops()

    # Up to this many rows, a weight-streaming GEMV kernel beats the BLAS GEMM (decode of small batches).
    SKINNY_ROWS = 4

    def linear(self, x, weight, bias=None):
        if x.dim() == 2 and x.shape[0] <= self.SKINNY_ROWS and x.dtype == torch.float32 == weight.dtype:
            out = self._kernels.skinny_linear(x, weight)
            return out if bias is None else out + bias
        return super().linear(x, weight, bias)

    def lm_head(self, h, weight):
        if h.shape[0] <= self.SKINNY_ROWS and h.dtype == torch.float32 == weight.dtype:
            return self._kernels.skinny_linear(h, weight)
        return super().lm_head(h, weight)

    def top_k_top_p(self, logits, k, p):
        if k is None and p is None:
            return logits
        return self._kernels.apply_top_k_top_p(logits, k, p)
