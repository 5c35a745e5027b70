"""The tensors of a mixture-of-experts layer: their names in the checkpoint, and where they go.

One spelling inside the engine, Qwen-MoE's per-expert names (`mlp.gate.weight`,
`mlp.experts.{e}.{gate,up,down}_proj.weight`, `mlp.shared_expert.*`, `mlp.shared_expert_gate.weight`). Checkpoints
spell them three ways, all accepted: those names; Mixtral's (`block_sparse_moe.gate`, `experts.{e}.w1` gate,
`w3` up, `w2` down); and transformers 5's fused 3-D tensors (`mlp.experts.gate_up_proj` [E, 2I, H] with each
expert's gate rows first, `mlp.experts.down_proj` [E, H, I]), split per expert as they are read.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.models.lazy_tensor import LazyTensor, read_tensor

_MIXTRAL_EXPERT = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.(experts\.\d+\.)(w[123])\.weight$")
_MIXTRAL_GATE = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.gate\.weight$")
_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)$")
_MIXTRAL_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def canonical_names(weights: Iterable[tuple[str, torch.Tensor | LazyTensor]]
                    ) -> Iterator[tuple[str, torch.Tensor | LazyTensor]]:
    """The checkpoint's (name, tensor) pairs with expert tensors under the engine's names; others pass through."""
    for name, tensor in weights:
        m = _MIXTRAL_EXPERT.match(name)
        if m:
            yield f"{m.group(1)}mlp.{m.group(2)}{_MIXTRAL_PROJ[m.group(3)]}.weight", tensor
            continue
        m = _MIXTRAL_GATE.match(name)
        if m:
            yield f"{m.group(1)}mlp.gate.weight", tensor
            continue
        m = _FUSED.match(name)
        if m and len(tensor.shape) == 3:
            whole = read_tensor(tensor)  # per-expert views of it (a tensor-parallel rank then narrows each)
            if m.group(2) == "down_proj":
                for e in range(whole.shape[0]):
                    yield f"{m.group(1)}{e}.down_proj.weight", whole[e]
            else:
                inter = whole.shape[1] // 2
                for e in range(whole.shape[0]):
                    yield f"{m.group(1)}{e}.gate_proj.weight", whole[e, :inter]
                    yield f"{m.group(1)}{e}.up_proj.weight", whole[e, inter:]
            continue
        yield name, tensor


def expected_weights(cfg: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """The sparse MLP's tensors of decoder layer `layer` with their shapes."""
    moe, h = cfg.moe, cfg.hidden_size
    p = f"model.layers.{layer}.mlp."
    out = {p + "gate.weight": (moe.num_experts, h)}
    mlps = [(f"experts.{e}.", moe.intermediate_size) for e in range(moe.num_experts)]
    if moe.shared_intermediate_size:
        mlps.append(("shared_expert.", moe.shared_intermediate_size))
        out[p + "shared_expert_gate.weight"] = (1, h)
    for prefix, inter in mlps:
        out.update({p + prefix + "gate_proj.weight": (inter, h), p + prefix + "up_proj.weight": (inter, h),
                    p + prefix + "down_proj.weight": (h, inter)})
    return out


def load_layer(load_linear, moe_block, got: dict, layer: int) -> None:
    """Copies layer `layer`'s expert tensors from `got` into moe_block (rtp_llm/layers/moe.py) through the model's
    load_linear(Linear, [row-concatenated parts])."""
    p = f"model.layers.{layer}.mlp."
    load_linear(moe_block.router, [got[p + "gate.weight"]])
    mlps = [(f"experts.{e}.", mlp) for e, mlp in enumerate(moe_block.experts)]
    if moe_block.shared is not None:
        mlps.append(("shared_expert.", moe_block.shared))
        load_linear(moe_block.shared_gate, [got[p + "shared_expert_gate.weight"]])
    for prefix, mlp in mlps:
        load_linear(mlp.gate_up, [got[p + prefix + "gate_proj.weight"], got[p + prefix + "up_proj.weight"]])
        load_linear(mlp.down, [got[p + prefix + "down_proj.weight"]])
