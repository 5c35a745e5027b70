"""A LoRA adapter read and checked against the base model: each target module's A [r, in] and B [out, r] with its
scale. PEFT's (adapter_config.json + adapter_model.safetensors: lora_alpha / r, or / sqrt(r) with use_rslora) or
llama.cpp's GGUF adapter (gguf_adapter.py). What PEFT can express but this engine does not run (modules_to_save, DoRA,
biases, alpha_pattern) is refused by name."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Optional

import torch

from rtp_llm.errors import LoRAError
from rtp_llm.lora.gguf_adapter import read_gguf_adapter

# PEFT's module names -> (the fused layer that holds it, which slice of that layer's output)
MODULES = {"q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2), "o_proj": ("o", 0),
           "gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "down_proj": ("down", 0)}
_NAME = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])"
                   r"(?:\.default)?\.weight$")


@dataclass
class LoRARequest:
    """vLLM's LoRARequest: a name (what a request's `model` says), a positive id, the adapter's directory."""
    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: Optional[str] = None

    def __post_init__(self):
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be positive, got {self.lora_int_id}")


@dataclass
class LoRAAdapter:
    request: LoRARequest
    rank: int
    # (layer, module) -> (A [r, in], B [out, r], scale), float32, as read
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, float]] = field(default_factory=dict)
    # per layer, fused linear -> its weights as the device's lora_pack made them (LoRAManager, which then drops
    # `weights`)
    packed: list = field(default_factory=list)

    @classmethod
    def load(cls, request: LoRARequest, model_config, max_rank: int) -> "LoRAAdapter":
        """A PEFT adapter directory, or llama.cpp's GGUF adapter (a .gguf file): read, then checked the same way."""
        name, path = request.lora_name, request.lora_path
        if path.endswith(".gguf"):  # a PEFT adapter is a directory
            pairs, alpha = read_gguf_adapter(path, name, model_config)
            scale = (lambda r: alpha / r) if alpha else (lambda r: 1.0)  # llama.cpp's rule
        else:
            pairs, scale = _read_peft(path, name, max_rank)
        adapter = cls(request, max((ab["A"].shape[0] for ab in pairs.values() if "A" in ab), default=0))
        expected = _shapes(model_config)
        for (layer, module), ab in sorted(pairs.items()):
            if set(ab) != {"A", "B"}:
                raise LoRAError(f"LoRA adapter {name!r}: layer {layer} {module} has lora_{''.join(ab)} without "
                                f"its pair")
            if layer >= model_config.num_layers:
                raise LoRAError(f"LoRA adapter {name!r}: layer {layer} does not exist (the base has "
                                f"{model_config.num_layers})")
            a, b = ab["A"].float(), ab["B"].float()
            rank = a.shape[0]
            if a.dim() == 2 and rank > max_rank:
                raise LoRAError(f"LoRA adapter {name!r}: layer {layer} {module} has rank {rank}, which exceeds "
                                f"--max_lora_rank {max_rank}")
            fan_in, fan_out = expected[module]
            if a.dim() != 2 or b.dim() != 2 or a.shape[1] != fan_in or b.shape != (fan_out, rank):
                raise LoRAError(f"LoRA adapter {name!r}: layer {layer} {module} has A {tuple(a.shape)} and B "
                                f"{tuple(b.shape)}; this base needs A [r, {fan_in}] and B [{fan_out}, r] (an "
                                f"adapter of another base model?)")
            adapter.weights[(layer, module)] = (a.contiguous(), b.contiguous(), scale(rank))
        if not adapter.weights:
            raise LoRAError(f"LoRA adapter {name!r}: no LoRA tensors in {path}")
        return adapter


def _read_peft(path: str, name: str, max_rank: int):
    """PEFT's adapter_config.json checked and its tensors paired: ((layer, module) -> {"A", "B"}, scale(rank))."""
    cfg_path = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(cfg_path):
        raise LoRAError(f"LoRA adapter {name!r}: no adapter_config.json in {path}")
    with open(cfg_path) as f:
        cfg = json.load(f)
    for key, bad in (("modules_to_save", lambda v: bool(v)), ("use_dora", lambda v: bool(v)),
                     ("bias", lambda v: v not in (None, "none")), ("fan_in_fan_out", lambda v: bool(v)),
                     ("alpha_pattern", lambda v: bool(v))):
        if bad(cfg.get(key)):
            raise LoRAError(f"LoRA adapter {name!r}: {key}={cfg[key]!r} is not supported (plain LoRA on the "
                            f"attention and MLP projections only)")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"LoRA adapter {name!r}: peft_type {cfg.get('peft_type')!r} is not LORA")
    targets = cfg.get("target_modules") or []
    targets = list(MODULES) if targets == "all-linear" else [targets] if isinstance(targets, str) else targets
    unknown = sorted(set(t.rsplit(".", 1)[-1] for t in targets) - set(MODULES))
    if unknown:
        raise LoRAError(f"LoRA adapter {name!r}: target modules {unknown} are not supported (only "
                        f"{', '.join(MODULES)})")
    r = int(cfg["r"])
    if r > max_rank:
        raise LoRAError(f"LoRA adapter {name!r}: rank {r} exceeds --max_lora_rank {max_rank}")
    alpha = float(cfg.get("lora_alpha", r))
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for tname, t in _read_tensors(path, name).items():
        m = _NAME.match(tname)
        if m is None or m.group(2) not in MODULES:
            raise LoRAError(f"LoRA adapter {name!r}: tensor {tname} is not a LoRA A or B of "
                            f"{', '.join(MODULES)}")
        pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = t
    rslora = bool(cfg.get("use_rslora"))
    return pairs, (lambda rank: alpha / math.sqrt(rank) if rslora else alpha / rank)


def _read_tensors(path: str, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    for file in ("adapter_model.safetensors",):
        full = os.path.join(path, file)
        if os.path.isfile(full):
            return load_file(full)
    raise LoRAError(f"LoRA adapter {name!r}: no adapter_model.safetensors in {path} (pickle .bin adapters are not "
                    f"read)")


def _shapes(mc) -> dict[str, tuple[int, int]]:
    h, q, kv, inter = mc.hidden_size, mc.q_size, mc.kv_size, mc.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, inter),
            "up_proj": (h, inter), "down_proj": (inter, h)}
