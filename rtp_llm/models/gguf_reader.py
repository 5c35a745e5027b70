"""GGUF files through the `gguf` package: metadata as plain Python values; tensors dequantized, or, for the
block formats of rtp_llm/models/quantized.py when asked, kept as their blocks (QuantizedWeight).

Tensor names are mapped to Hugging Face names; a mixture-of-experts layer's 3-D expert tensors
(`ffn_{gate,up,down}_exps`, experts on the outer axis) become one matrix per expert, each kept as its own
blocks. For the `llama` architecture llama.cpp's converter
permutes the rows of Q and K (interleaved RoPE pairs); that is undone here, because this engine
applies RoPE as the Hugging Face models do (rotate-half). Qwen2/Qwen3 files are not permuted.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import Any, Iterator

import numpy as np
import torch

from rtp_llm.errors import CheckpointError
from rtp_llm.models.quantized import BLOCK_BYTES, QuantizedWeight

_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name; for 3-D expert tensors a template with `{e}` for the expert."""
    m = _BLK.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        if part in _EXPERTS:
            return f"model.layers.{layer}.mlp.experts.{{e}}.{_EXPERTS[part]}.{kind}"
        return f"model.layers.{layer}.{_LAYER[part]}.{kind}" if part in _LAYER else None
    base, _, kind = gguf_name.rpartition(".")
    return f"{_GLOBAL[base]}.{kind}" if base in _GLOBAL else None


def _field_value(field) -> Any:
    return field.contents()


class GGUFFile:
    def __init__(self, path: str):
        import gguf  # imported here: only GGUF users need it

        self._gguf = gguf
        try:
            self.reader = gguf.GGUFReader(path)
        except Exception as exc:  # the gguf package raises ValueError / struct errors on bad files
            raise CheckpointError(f"{path} is not a readable GGUF file: {exc}") from exc
        self.path = path
        self.tensor_names = {t.name for t in self.reader.tensors}

    def metadata(self, skip_large: bool = True) -> dict[str, Any]:
        out = {}
        for key, field in self.reader.fields.items():
            if skip_large and key in ("tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
                continue
            out[key] = _field_value(field)
        return out

    def field(self, key: str, default: Any = None) -> Any:
        f = self.reader.fields.get(key)
        return default if f is None else _field_value(f)

    def tensors(self, num_heads: int, num_kv_heads: int, unpermute_qk: bool,
                keep_quantized: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
        """(HF name, float32 tensor) for every tensor the model uses; with keep_quantized, a matrix stored in one
        of BLOCK_BYTES' formats comes as a QuantizedWeight over the file's mapping (copied when the model keeps it)."""
        for t in self.reader.tensors:
            name = hf_name(t.name)
            if name is None:
                continue  # e.g. rope_freqs: not used by these architectures
            fmt = t.tensor_type.name
            if "{e}" in name:  # [experts, rows, cols]: one matrix per expert
                experts, rows = int(t.shape[2]), int(t.shape[1])
                if keep_quantized and fmt in BLOCK_BYTES:
                    blocks = t.data.reshape(experts, rows, -1, BLOCK_BYTES[fmt])
                    for e in range(experts):
                        yield name.format(e=e), QuantizedWeight(blocks[e], fmt)
                    continue
                whole = np.asarray(self._gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
                whole = whole.reshape(experts, rows, int(t.shape[0]))
                for e in range(experts):
                    yield name.format(e=e), torch.from_numpy(np.array(whole[e], dtype=np.float32, order="C"))
                continue
            if keep_quantized and fmt in BLOCK_BYTES and len(t.shape) == 2:
                rows = int(t.shape[1])
                blocks = t.data.reshape(rows, -1, BLOCK_BYTES[fmt])
                if unpermute_qk and name.endswith(("q_proj.weight", "k_proj.weight")):
                    blocks = np.ascontiguousarray(_unpermute(blocks, num_heads if ".q_proj." in name else num_kv_heads))
                yield name, QuantizedWeight(blocks, fmt)
                continue
            data = self._gguf.quants.dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if name.endswith("shared_expert_gate.weight"):
                shape = (1, shape[-1])  # stored as a vector: the [1, hidden] matrix transformers holds
            arr = np.asarray(data, dtype=np.float32).reshape(shape)
            if unpermute_qk and name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
                heads = num_heads if ".q_proj." in name else num_kv_heads
                arr = _unpermute(arr, heads)
            if not arr.flags.writeable or not arr.flags.c_contiguous:  # F32 tensors are read-only mmap views
                arr = np.array(arr, dtype=np.float32, order="C")
            yield name, torch.from_numpy(arr)


_shared = threading.local()


@contextlib.contextmanager
def shared_gguf_files() -> Iterator[None]:
    """Within it, open_gguf parses each file once. The gguf package parses a file's whole metadata up front, ~10 s for a
    Qwen vocabulary's 150k tokens and merges, and loading a model opens its file for the config, the memory plan, the
    weights and the tokenizer. Outside it nothing is kept: a kept reader would keep the file's pages mapped."""
    outer = getattr(_shared, "files", None)
    if outer is None:
        _shared.files = {}
    try:
        yield
    finally:
        if outer is None:
            _shared.files = None


def open_gguf(path: str) -> GGUFFile:
    files = getattr(_shared, "files", None)
    if files is None:
        return GGUFFile(path)
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
    if key not in files:
        files[key] = GGUFFile(path)
    return files[key]


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows grouped (head, pair, half) -> (head, half, pair)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))
