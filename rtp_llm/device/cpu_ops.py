"""The CPU's fused-op set: torch ops, except top-k/top-p, which runs the C++ twin of the operator
(rtp_llm/cpp/ops/top_k_top_p.cc): bit-identical masks without sorting the vocabulary (see
benchmarks/top_k_top_p.py for the speed-up)."""

from rtp_llm.layers.ops import TorchOps


class CpuOps(TorchOps):
    name = "cpu"

    def __init__(self):
        from rtp_llm._native import ops

        self._kernels = ops()

    def top_k_top_p(self, logits, k, p):
        if k is None and p is None:
            return logits
        return self._kernels.apply_top_k_top_p(logits, k, p)
