"""The sparse MLP of mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral): a router picks each token's top-k
experts, each expert is a gated MLP on the device's kernels, and a token's output is the weighted sum of its
experts' outputs.

The device's op set routes (ops.route) and runs the experts (ops.moe_experts): by default tokens grouped by expert,
so an expert's weights are read once per step whatever the number of tokens routed to it, and a decode step reads
only the experts its tokens route to; the NPU's runs the grouped-matmul op sequence vllm-ascend uses. On the CPU a
token's output never depends on the other tokens of the step: the router and the experts run on kernels whose rows
are independent, and each token's sum runs over its own experts in ascending expert order from zero (as
transformers adds them). Under tensor parallelism every rank holds a slice of every expert's intermediate dimension
(and of the shared expert's): the partial sums meet in one all-reduce after the block.
"""

from __future__ import annotations

import torch
from torch import nn

from rtp_llm.config.model_config import MoEConfig
from rtp_llm.layers.linear import Linear
from rtp_llm.layers.mlp import GatedMLP


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, moe: MoEConfig, intermediate: int, shared_intermediate: int, dtype, device, ops,
                 tp=None):
        """intermediate / shared_intermediate: this rank's slice of each expert's (and the shared expert's)
        intermediate dimension (the whole of it without tensor parallelism)."""
        super().__init__()
        self.top_k, self.renormalize = moe.top_k, moe.renormalize
        self.weights_dtype = dtype if moe.weights_in_model_dtype else None
        self.ops, self.tp = ops, tp
        self.router = Linear(hidden, moe.num_experts, False, dtype, device)
        # experts' down projections sum locally (tp=None): one all-reduce after the block, not one per expert
        self.experts = nn.ModuleList(GatedMLP(hidden, intermediate, False, dtype, device, ops)
                                     for _ in range(moe.num_experts))
        self.shared = None
        self.shared_gate = None
        if moe.shared_intermediate_size:
            self.shared = GatedMLP(hidden, shared_intermediate, False, dtype, device, ops)
            self.shared_gate = Linear(hidden, 1, False, dtype, device)

    def linears(self) -> list[Linear]:
        out = [self.router]
        for mlp in self.experts:
            out += [mlp.gate_up, mlp.down]
        if self.shared is not None:
            out += [self.shared.gate_up, self.shared.down, self.shared_gate]
        return out

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.ops.route(self.router(h), self.top_k, self.renormalize, self.weights_dtype)
        out = self.ops.moe_experts(h, weights, ids, self)
        if self.shared is not None:
            shared = self.ops.mlp(h, self.shared.gate_up, self.shared.down)
            out = out + torch.sigmoid(self.shared_gate(h)) * shared
        return out if self.tp is None else self.tp.all_reduce(out)
