"""The gated MLP of Llama / Qwen: down(silu(gate) * up), gate and up in one column-parallel matmul, down
row-parallel under tensor parallelism. The device's op set runs it (TorchOps.mlp), so that it may fuse the
activation into gate_up's kernel or split a prefill's rows."""

from __future__ import annotations

from torch import nn

from rtp_llm.layers.linear import Linear


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool, dtype, device, ops, tp=None):
        super().__init__()
        self.gate_up = Linear(hidden, 2 * intermediate, bias, dtype, device, feeds_silu=True)
        self.down = Linear(intermediate, hidden, bias, dtype, device, tp=tp)
        self.ops = ops

    def forward(self, h):
        return self.ops.mlp(h, self.gate_up, self.down)
