"""Loads checkpoints into {Hugging Face tensor name: tensor}.

Supported: a Hugging Face directory with safetensors (one file, or sharded with
model.safetensors.index.json), memory-mapped; a .gguf file (dequantized, or with keep_quantized its
block-format matrices as QuantizedWeight). Pickle checkpoints
(pytorch_model.bin, *.pt) can run arbitrary code when loaded, so they are refused unless
allow_pickle=True.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator

import torch

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.errors import CheckpointError, MissingFileError, UnsafeCheckpointError
from rtp_llm.models.lazy_tensor import LazyTensor


def is_gguf(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(".gguf")


def find_gguf(path: str) -> str | None:
    """The .gguf file a path names: the file itself, or the only .gguf in a directory without safetensors."""
    if is_gguf(path):
        return path
    if os.path.isdir(path) and not glob.glob(os.path.join(path, "*.safetensors")):
        found = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if len(found) == 1:
            return found[0]
    return None


def load_config(path: str, model_type: str | None = None, overrides: dict | None = None) -> ModelConfig:
    """overrides: keys merged into config.json first (vLLM's hf_overrides)."""
    if not os.path.exists(path):
        raise MissingFileError(f"checkpoint path {path} does not exist")
    gguf_path = find_gguf(path)
    if gguf_path and overrides:
        raise CheckpointError("hf_overrides applies to a Hugging Face checkpoint's config.json, not to a GGUF")
    if gguf_path:
        from rtp_llm.models.gguf_reader import open_gguf

        f = open_gguf(gguf_path)
        return ModelConfig.from_gguf_metadata(f.metadata(), f.tensor_names, model_type)
    return ModelConfig.from_hf_dir(path, model_type, overrides)


def _safetensors_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        missing = [x for x in files if not os.path.isfile(os.path.join(path, x))]
        if missing:
            raise MissingFileError(f"{index} lists shards that are missing: {', '.join(missing)}")
        return [os.path.join(path, x) for x in files]
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


def iter_checkpoint(path: str, config: ModelConfig, allow_pickle: bool = False,
                    keep_quantized: bool = False) -> Iterator[tuple[str, torch.Tensor | LazyTensor]]:
    """(name, tensor) pairs in the checkpoint's own dtype (GGUF: float32), lazily: safetensors entries
    come as LazyTensor, read (whole or a tensor-parallel slice) only by the model's load_weights."""
    gguf_path = find_gguf(path)
    if gguf_path:
        from rtp_llm.models.gguf_reader import open_gguf

        # llama.cpp's converter permutes Q and K of its llama architecture, Mixtral included
        yield from open_gguf(gguf_path).tensors(
            config.num_heads, config.num_kv_heads, unpermute_qk=config.model_type in ("llama", "mixtral"),
            keep_quantized=keep_quantized)
        return
    files = _safetensors_files(path)
    if files:
        from safetensors import safe_open

        for file in files:
            try:
                handle = safe_open(file, framework="pt")  # memory-mapped
            except Exception as exc:
                raise CheckpointError(f"{file} is not a readable safetensors file: {exc}") from exc
            for name in handle.keys():
                yield name, LazyTensor(handle.get_slice(name))
        return
    pickles = sorted(glob.glob(os.path.join(path, "*.bin")) + glob.glob(os.path.join(path, "*.pt")))
    if pickles:
        if not allow_pickle:
            raise UnsafeCheckpointError(
                f"{path} has only pickle weights ({os.path.basename(pickles[0])}); loading pickle can run "
                "arbitrary code. Convert to safetensors, or pass --allow_pickle / allow_pickle=True if you trust it.")
        for file in pickles:
            state = torch.load(file, map_location="cpu", weights_only=True)
            yield from state.items()
        return
    raise MissingFileError(f"no weights in {path}: expected *.safetensors, model.safetensors.index.json or a .gguf")
