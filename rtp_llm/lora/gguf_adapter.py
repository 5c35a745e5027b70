"""llama.cpp's GGUF LoRA adapters (what its convert_lora_to_gguf.py writes): `general.type` "adapter",
`adapter.type` "lora", `adapter.lora.alpha`, and for each adapted base matrix `<its GGUF name>.lora_a` [r, in] and
`.lora_b` [out, r] (F32, F16, BF16 or Q8_0). Read with the engine's GGUF reader and handed to LoRAAdapter under PEFT's
names. llama.cpp's scale is alpha / r (1 when alpha is 0 or absent). Its converter permutes the `llama`
architecture's Q and K rows as it does the base's; B's rows are un-permuted here as the base loader un-permutes
the base. What llama.cpp reads but this engine does not run is refused by name: activated LoRA's invocation tokens,
adapters on the embeddings or the LM head, and the norm vectors mergekit adds (llama.cpp skips those silently)."""

from __future__ import annotations

import re

import numpy as np
import torch

from rtp_llm.config.model_config import GGUF_ARCHITECTURES
from rtp_llm.errors import CheckpointError, LoRAError
from rtp_llm.models.gguf_reader import GGUFFile, unpermute

_ARCH = {model_type: arch for arch, model_type in GGUF_ARCHITECTURES.items()}  # model type -> GGUF architecture
_MODULE = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
           "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")


def read_gguf_adapter(path: str, name: str, model_config) -> tuple[dict, float]:
    """((layer, PEFT module) -> {"A": [r, in], "B": [out, r]} float32, alpha), or LoRAError naming
    the problem."""
    import gguf

    who = f"LoRA adapter {name!r}"
    try:
        f = GGUFFile(path)
    except FileNotFoundError:
        raise LoRAError(f"{who}: no file {path}") from None
    except CheckpointError as exc:
        raise LoRAError(f"{who}: {exc}") from None
    kind = f.field("general.type")
    if kind != "adapter":
        raise LoRAError(f"{who}: {path} has general.type {kind!r}, not 'adapter' (a model file, not a LoRA adapter?)")
    if f.field("adapter.type") != "lora":
        raise LoRAError(f"{who}: adapter.type {f.field('adapter.type')!r} is not 'lora'")
    arch, want = f.field("general.architecture"), _ARCH.get(model_config.model_type)
    if arch != want:
        raise LoRAError(f"{who}: the adapter is for a {arch!r} model; this base is {want or model_config.model_type!r}")
    if f.field("adapter.alora.invocation_tokens") is not None:
        raise LoRAError(f"{who}: activated LoRA (adapter.alora.invocation_tokens) is not supported")
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    permuted = arch == "llama"
    for t in f.tensor_list:
        m = _TENSOR.match(t.name)
        if m is None or m.group(2) not in _MODULE:
            raise LoRAError(f"{who}: tensor {t.name} is not supported (LoRA on the attention and MLP projections only: "
                        f"{', '.join(f'blk.N.{k}.weight.lora_a/b' for k in _MODULE)})")
        layer, module, ab = int(m.group(1)), _MODULE[m.group(2)], m.group(3).upper()
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if ab == "B" and permuted and module in ("q_proj", "k_proj") and arr.ndim == 2:
            heads = model_config.num_heads if module == "q_proj" else model_config.num_kv_heads
            if arr.shape[0] % (2 * heads) == 0:  # a wrong row count is left for the shape check to name
                arr = unpermute(arr, heads)
        pairs.setdefault((layer, module), {})[ab] = torch.from_numpy(np.array(arr, dtype=np.float32, order="C"))
    return pairs, float(f.field("adapter.lora.alpha") or 0.0)
