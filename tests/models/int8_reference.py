"""The reference for --quantization int8: a transformers model whose linear weights are replaced by the values their
per-channel int8 form stands for (q * scale, through gguf's own Q8_0 dequantize)."""

import gguf
import torch

from rtp_llm.models.quantized import QuantizedWeight

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def int8_values(w: torch.Tensor) -> torch.Tensor:
    q = QuantizedWeight.per_channel_int8(w)
    flat = q.blocks.reshape(w.shape[0], -1).numpy()
    return torch.from_numpy(gguf.quants.dequantize(flat, gguf.GGMLQuantizationType.Q8_0)).reshape(w.shape)


def to_int8_values(hf, head: bool = True):
    """hf with each linear layer's weight (and, with head, lm_head's) replaced in place by its int8 values."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".weight") and (name.split(".")[-2] in LINEARS or (head and name == "lm_head.weight")):
                p.copy_(int8_values(p))
    return hf
