"""GGUF files: the header read here (metadata as plain Python values), tensors dequantized by the `gguf` package or, for the
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
import struct
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


# GGUF value types (the format's spec, gguf-py's GGUFValueType): numeric ones as struct codes.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_FIXED = {  # types whose tensors the gguf reader exposes as typed arrays rather than raw bytes
    "F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16, "I32": np.int32,
    "I64": np.int64}


class GGUFTensor:
    """A tensor's header entry and its bytes in the file's mapping, shaped as gguf.GGUFReader shapes them."""

    __slots__ = ("name", "tensor_type", "shape", "data")

    def __init__(self, name, tensor_type, shape, data):
        self.name, self.tensor_type, self.shape, self.data = name, tensor_type, shape, data


class _Header:
    """Reads the header (magic, key/values, tensor infos) straight from the mapped bytes. gguf.GGUFReader builds a
    numpy view per array element, ~5 s for a 49k-token vocabulary and ~10 s for Qwen's 150k tokens and merges;
    this walks them with struct, so a load is not spent parsing its vocabulary."""

    def __init__(self, buf: memoryview, path: str):
        self.buf, self.path, self.at = buf, path, 0

    def take(self, code: str):
        v = struct.unpack_from("<" + code, self.buf, self.at)[0]
        self.at += struct.calcsize(code)
        return v

    def string(self) -> str:
        n = self.take("Q")
        s = bytes(self.buf[self.at:self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return s

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.take("I"), self.take("Q")
            if itype in _SCALARS:  # one read for the whole array
                dt = np.dtype("<" + _SCALARS[itype]) if _SCALARS[itype] != "?" else np.dtype(np.bool_)
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.at)
                self.at += arr.nbytes
                return arr.tolist()
            return [self.value(itype) for _ in range(count)]
        raise CheckpointError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.at}")


def _parse(path: str, gguf) -> tuple[dict[str, Any], list[GGUFTensor]]:
    data = np.memmap(path, mode="r")
    buf = memoryview(data)
    h = _Header(buf, path)
    if len(buf) < 24 or bytes(buf[:4]) != b"GGUF":
        raise CheckpointError(f"{path} is not a GGUF file (no GGUF magic)")
    h.at = 4
    version = h.take("I")
    if version not in (2, 3):
        raise CheckpointError(f"{path}: GGUF version {version & 0xFFFFFFFF} is not supported (2 or 3, little-endian)")
    tensor_count, kv_count = h.take("Q"), h.take("Q")
    fields: dict[str, Any] = {}
    for _ in range(kv_count):
        key = h.string()
        if key in fields:
            raise CheckpointError(f"{path}: metadata key {key!r} appears twice")
        fields[key] = h.value(h.take("I"))
    infos = []
    for _ in range(tensor_count):
        name = h.string()
        dims = [h.take("Q") for _ in range(h.take("I"))]
        infos.append((name, dims, h.take("I"), h.take("Q")))
    align = int(fields.get("general.alignment", 32))
    if align <= 0 or align & (align - 1):
        raise CheckpointError(f"{path}: general.alignment {align} is not a power of two")
    start = -(-h.at // align) * align
    tensors, seen = [], set()
    for name, dims, raw_type, offset in infos:
        if name in seen:
            raise CheckpointError(f"{path}: tensor {name!r} appears twice")
        seen.add(name)
        qtype = gguf.GGMLQuantizationType(raw_type)
        shape = tuple(reversed(dims))
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        elems = int(np.prod(dims)) if dims else 1
        if qtype.name in _FIXED:
            dtype, count = np.dtype(_FIXED[qtype.name]), elems
        else:
            dtype, count = np.dtype(np.uint8), elems * type_size // block
            shape = gguf.quant_shape_to_byte_shape(shape, qtype)
        begin = start + offset
        if begin + count * dtype.itemsize > len(data):
            raise CheckpointError(f"{path}: tensor {name!r} runs past the end of the file (truncated?)")
        arr = data[begin:begin + count * dtype.itemsize].view(dtype).reshape(shape)
        tensors.append(GGUFTensor(name, qtype, np.array(dims, dtype=np.uint64), arr))
    return fields, tensors


class GGUFFile:
    def __init__(self, path: str):
        import gguf  # imported here: only GGUF users need it

        self._gguf = gguf
        try:
            self.fields, self.tensor_list = _parse(path, gguf)
        except CheckpointError:
            raise
        except (ValueError, struct.error, UnicodeDecodeError) as exc:  # a truncated or malformed header
            raise CheckpointError(f"{path} is not a readable GGUF file: {exc}") from exc
        self.path = path
        self.tensor_names = {t.name for t in self.tensor_list}

    def metadata(self, skip_large: bool = True) -> dict[str, Any]:
        large = ("tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
        return {k: v for k, v in self.fields.items() if not (skip_large and k in large)}

    def field(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def tensors(self, num_heads: int, num_kv_heads: int, unpermute_qk: bool,
                keep_quantized: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
        """(HF name, float32 tensor) for every tensor the model uses; with keep_quantized, a matrix stored in one
        of BLOCK_BYTES' formats comes as a QuantizedWeight over the file's mapping (copied when the model keeps it)."""
        for t in self.tensor_list:
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
                    blocks = np.ascontiguousarray(unpermute(blocks, num_heads if ".q_proj." in name else num_kv_heads))
                yield name, QuantizedWeight(blocks, fmt)
                continue
            data = self._gguf.quants.dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if name.endswith("shared_expert_gate.weight"):
                shape = (1, shape[-1])  # stored as a vector: the [1, hidden] matrix transformers holds
            arr = np.asarray(data, dtype=np.float32).reshape(shape)
            if unpermute_qk and name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
                heads = num_heads if ".q_proj." in name else num_kv_heads
                arr = unpermute(arr, heads)
            if not arr.flags.writeable or not arr.flags.c_contiguous:  # F32 tensors are read-only mmap views
                arr = np.array(arr, dtype=np.float32, order="C")
            yield name, torch.from_numpy(arr)


_shared = threading.local()


@contextlib.contextmanager
def shared_gguf_files() -> Iterator[None]:
    """Within it, open_gguf parses each file once: loading a model opens its file for the config, the memory plan,
    the weights and the tokenizer. Outside it nothing is kept: a kept reader would keep the file's pages mapped."""
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


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows grouped (head, pair, half) -> (head, half, pair). Also undoes it on a
    GGUF LoRA adapter's Q and K B matrices, which its converter permutes the same way."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))
