"""Mixture-of-experts layers on Ascend, as vllm-ascend runs them without expert parallelism (its all-gather
dispatcher): npu_moe_gating_top_k_softmax routes, npu_moe_init_routing_v2 sorts the token copies by expert,
npu_grouped_matmul runs every expert's gate_up and down projections in one call each (npu_swiglu between them),
and npu_moe_token_unpermute puts the copies back in token order, weighted and summed.

npu_moe_finalize_routing is not used: vllm-ascend replaced it by npu_moe_token_unpermute when it moved to
npu_moe_init_routing_v2, whose row index is the sorted -> original map that the unpermute op takes, not the
original -> sorted map finalize_routing reads. npu_moe_gating_top_k (DeepSeek's grouped router) is not used
either: its documentation does not state how it normalises the softmax case's outputs (its eps and scaling factor
are described for the sigmoid router), while the softmax variant's math is stated: softmax, then top-k.

The experts' weights are stacked per layer at load, [E, H, 2I] and [E, I, H] in the model's dtype, as the grouped
matmul takes them; GGUF experts are dequantized for it (the weight-quant grouped matmul takes int8 / int4 with
per-channel or per-group scales, a layout the experts' blocks are not converted to yet: the load log says so).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

class NpuExperts:
    """One layer's experts stacked for npu_grouped_matmul."""

    def __init__(self, block, dequantized: list):
        w13, w2 = [], []
        for mlp in block.experts:
            for lin, out in ((mlp.gate_up, w13), (mlp.down, w2)):
                weight = lin.weight
                if lin.quantized is not None:  # kept as GGUF blocks: the grouped matmul gets float weights
                    dequantized.append(lin.quantized.format)
                    weight = lin.quantized.dequantize().to(weight.dtype).to(weight.device)
                out.append(weight.t())
            for lin in (mlp.gate_up, mlp.down):  # the stacked copy replaces the per-expert weights
                lin.weight.data = torch.empty(0, dtype=lin.weight.dtype, device=lin.weight.device)
                lin.quantized = None
        self.w13 = torch.stack(w13).contiguous()  # [E, H, 2I]
        self.w2 = torch.stack(w2).contiguous()    # [E, I, H]
        self.num_experts = len(w13)


def prepare(block) -> None:
    dequantized: list = []
    block.npu_experts = NpuExperts(block, dequantized)
    if dequantized:
        log.info("npu: %d expert matrices (%s) dequantized at load for npu_grouped_matmul", len(dequantized),
                 "/".join(sorted(set(dequantized))))


def route(torch_npu, logits: torch.Tensor, top_k: int, renormalize: bool, weights_dtype):
    """The router on the device: softmax and top-k in float32 (the logits cast up, as transformers computes the
    softmax), renormalised in torch ops where the architecture does."""
    weights, ids, _ = torch_npu.npu_moe_gating_top_k_softmax(logits.float().contiguous(), None, k=top_k)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if weights_dtype is None else weights.to(weights_dtype)), ids


def experts(torch_npu, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, stacked: NpuExperts):
    tokens, top_k = ids.shape
    rows, row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(
        h, ids.to(torch.int32), active_num=tokens * top_k, expert_num=stacked.num_experts,
        expert_tokens_num_type=1, expert_tokens_num_flag=True, active_expert_range=[0, stacked.num_experts],
        quant_mode=-1)
    counts = counts.to(torch.int64)
    gate_up = torch_npu.npu_grouped_matmul([rows], [stacked.w13], group_list=counts, split_item=2, group_type=0,
                                           group_list_type=1)[0]
    act = torch_npu.npu_swiglu(gate_up, dim=-1)
    down = torch_npu.npu_grouped_matmul([act], [stacked.w2], group_list=counts, split_item=2, group_type=0,
                                        group_list_type=1)[0]
    # the copies back in token order, each times its weight, summed per token (Mixtral's float32 weights as bf16:
    # the op takes bf16 probs only)
    return torch_npu.npu_moe_token_unpermute(down, row_idx, probs=weights.to(torch.bfloat16))
