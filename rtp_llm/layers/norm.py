"""RMSNorm (and the residual add before it) through the device's fused op where it has one; the reference math
is rtp_llm/device/torch_ops.rms_norm (float32, cast back as the Hugging Face models do)."""

from __future__ import annotations

from torch import nn

from rtp_llm.layers.linear import parameter


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype, device, ops):
        super().__init__()
        self.weight = parameter((size,), dtype, device)
        self.eps, self.ops = eps, ops

    def forward(self, x):
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add(self, x, residual):
        """(norm(x + residual), x + residual)."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)
