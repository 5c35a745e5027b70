"""Linear: y = x W^T + b through the kernel its device chose for this weight once, at load
(Device.ops().prepare_linears: pack once, run many). Row-parallel under tensor parallelism: each rank multiplies
its input slice and the partial sums meet in one all-reduce, the bias added after it."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from rtp_llm.device.torch_ops import TorchLinear


def parameter(shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype, device, tp=None,
                 feeds_silu: bool = False, tied: Optional[nn.Parameter] = None):
        """tp: the TensorParallel group of a row-parallel layer (None: local). feeds_silu: the output only feeds
        silu_and_mul ([gate | up]), so a device may fuse the activation into this layer's kernel. tied: another
        layer's weight this one multiplies with (an LM head tied to the embedding)."""
        super().__init__()
        self.weight = tied if tied is not None else parameter((out_features, in_features), dtype, device)
        self.bias: Optional[nn.Parameter] = parameter((out_features,), dtype, device) if bias else None
        self.tp, self.feeds_silu, self.tied = tp, feeds_silu, tied is not None
        # The weight as its file's blocks (rtp_llm/models/quantized.py), set at load when the device multiplies that
        # format itself (ops.quantized_formats); `weight` is then empty.
        self.quantized = None
        self.kernel = TorchLinear(self.weight)
        self.lora = None  # rtp_llm/lora/layers.py: LoRA adapters' deltas on this layer's output (--enable_lora)

    @property
    def lora_active(self) -> bool:
        """This step adds adapter deltas here (a fused kernel that hides the output, e.g. gate_up's SiLU
        epilogue, must not run)."""
        return self.lora is not None and self.lora.active

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            y = self.kernel(x, self.bias)
            return self.lora.add(x, y) if self.lora_active else y
        y = self.kernel(x, None)
        if self.lora_active:  # the delta of this rank's input slice joins its partial sum before the all-reduce
            y = self.lora.add(x, y)
        y = self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias
