"""The sparse MLP of mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral): a router picks each token's top-k
experts, each expert is a gated MLP on the device's kernels, and a token's output is the weighted sum of its
experts' outputs.

Tokens are grouped by expert, so an expert's weights are read once per step whatever the number of tokens routed
to it, and a decode step reads only the experts its tokens route to. A token's output never depends on the other
tokens of the step: the router and the experts run on kernels whose rows are independent (where the device has
them), and each token's sum runs over its own experts in ascending expert order from zero (as transformers adds
them). Under tensor parallelism every rank holds a slice of every expert's intermediate dimension (and of the
shared expert's): the partial sums meet in one all-reduce after the block.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from rtp_llm.config.model_config import MoEConfig
from rtp_llm.layers.linear import Linear
from rtp_llm.layers.mlp import GatedMLP


def route(logits: torch.Tensor, top_k: int, renormalize: bool,
          weights_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, top_k], expert ids [T, top_k]) from router logits [T, E]: softmax in float32 over every expert,
    torch.topk's choice and order (ties: torch.topk's), renormalised to sum 1 if asked; weights_dtype: the dtype
    the weights are rounded to before the products (None: float32)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if weights_dtype is None else weights.to(weights_dtype)), ids


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
        weights, ids = route(self.router(h), self.top_k, self.renormalize, self.weights_dtype)
        out = torch.zeros_like(h)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)  # by expert, then by token: each expert's rows in one GEMM
        tokens = order // self.top_k
        scales = weights.flatten()[order].unsqueeze(-1)
        start = 0
        for expert, count in enumerate(torch.bincount(flat, minlength=len(self.experts)).tolist()):
            if count == 0:
                continue
            rows = tokens[start:start + count]
            mlp = self.experts[expert]
            y = self.ops.mlp(h.index_select(0, rows), mlp.gate_up, mlp.down)
            out.index_add_(0, rows, (y * scales[start:start + count]).to(out.dtype))
            start += count
        if self.shared is not None:
            shared = self.ops.mlp(h, self.shared.gate_up, self.shared.down)
            out = out + torch.sigmoid(self.shared_gate(h)) * shared
        return out if self.tp is None else self.tp.all_reduce(out)
