"""model_type -> model class, and load_model(): config + weights from a path, ready to run.

Llama, Qwen2, Qwen3 and their mixture-of-experts kin (Qwen3-MoE, Qwen2-MoE, Mixtral) share one graph (DecoderLM);
their differences are ModelConfig flags and its MoEConfig.
"""

from __future__ import annotations

import logging
import os

import torch

from rtp_llm.config.model_config import ModelConfig, parse_dtype
from rtp_llm.models.decoder import DecoderLM
from rtp_llm.models.loader import find_gguf, iter_checkpoint, load_config
from rtp_llm.models.quantized import QUANTIZATION_MODES

log = logging.getLogger(__name__)

MODEL_CLASSES = {name: DecoderLM for name in ("qwen_3", "qwen_2", "llama", "qwen_3_moe", "qwen_2_moe", "mixtral")}


def stored_dtype(path: str, cfg: ModelConfig) -> torch.dtype:
    """The dtype the checkpoint's weights load as: its own (config.json), float32 for GGUF (its dequantized
    values; block-format matrices the device multiplies as stored keep their blocks; --dtype bfloat16 still
    applies)."""
    return torch.float32 if find_gguf(path) else cfg.dtype


def memory_plan(engine_config, device, block_size: int) -> tuple[int, int]:
    """(weight bytes, KV-cache bytes) an engine will hold, estimated before loading anything: the GGUF file's size
    where its blocks stay as stored, else the parameter count at the run dtype (1 byte each for int8 layers); the
    KV cache from num_blocks / kv_cache_memory_gb / the device's budget."""
    from rtp_llm.cache import kv_cache_blocks
    from rtp_llm.cache.kv_buffer import KVBuffer

    cfg = load_config(engine_config.model, engine_config.model_type, engine_config.hf_overrides)
    dtype = device.model_dtype(engine_config.dtype, stored_dtype(engine_config.model, cfg))
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    linear = layers * (h * (q + 2 * kv) + q * h)
    for i in range(layers):
        moe = cfg.moe if cfg.routes(i) else None  # every expert is resident, routed to or not
        linear += 3 * h * inter if moe is None else h * (moe.num_experts * (3 * moe.intermediate_size + 1)
                                                         + 3 * moe.shared_intermediate_size + 1)
    embed = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings or cfg.head != "lm" else 2)
    item = torch.empty((), dtype=dtype).element_size()
    gguf = find_gguf(engine_config.model)
    if gguf and engine_config.quantization == "auto" and device.ops().runs_quantized("Q8_0", dtype):
        weights = os.path.getsize(gguf)
    elif engine_config.quantization == "int8":
        weights = linear + embed * item
    else:
        weights = (linear + embed) * item
    blocks = kv_cache_blocks(engine_config, device, layers, block_size, cfg.num_kv_heads, cfg.head_dim, dtype)
    return weights, blocks * KVBuffer.bytes_per_block(layers, block_size, cfg.num_kv_heads, cfg.head_dim, dtype)


def load_engine_model(engine_config, device, tp=None, progress: bool = False) -> tuple[DecoderLM, ModelConfig]:
    """The model an engine runs: the EngineConfig's checkpoint in the dtype the device picks for it
    (Device.model_dtype: --dtype, or for auto what the device runs best), with the device's op set."""
    cfg = load_config(engine_config.model, engine_config.model_type, engine_config.hf_overrides)
    dtype = device.model_dtype(engine_config.dtype, stored_dtype(engine_config.model, cfg))
    return load_model(engine_config.model, engine_config.model_type, dtype, device.torch_device,
                      allow_pickle=engine_config.allow_pickle, progress=progress, ops=device.ops(), tp=tp, config=cfg,
                      quantization=engine_config.quantization)


def load_model(
    path: str,
    model_type: str | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    allow_pickle: bool = False,
    progress: bool = False,
    ops=None,
    tp=None,
    config: ModelConfig | None = None,
    quantization: str = "auto",
) -> tuple[DecoderLM, ModelConfig]:
    """ops: the device's op set (Device.ops()); None = plain torch.
    tp: a TensorParallel group; the model then holds (and reads) only this rank's slices.
    config: the checkpoint's ModelConfig when the caller has read it already.
    quantization: auto = a GGUF's block-format matrices stay as stored where the op set multiplies them
    (ops.runs_quantized), none = dequantized at load, int8 = every linear layer as per-output-channel int8 made at
    load from its float weight (any checkpoint; a GGUF's blocks are dequantized first)."""
    if quantization not in QUANTIZATION_MODES:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_MODES)}, got {quantization!r}")
    cfg = config or load_config(path, model_type)
    torch_dtype = parse_dtype(dtype, default=stored_dtype(path, cfg))
    model = MODEL_CLASSES[cfg.model_type](cfg, dtype=torch_dtype, device=device, ops=ops, tp=tp)
    model.load_weights(iter_checkpoint(path, cfg, allow_pickle=allow_pickle, keep_quantized=quantization == "auto"),
                       progress=progress, int8=quantization == "int8")
    model.prepare()  # each linear layer's kernel, packed as its device wants (CPU: panels or oneDNN's layout)
    log.info("loaded %s (%s, %d layers, %s) from %s", cfg.architecture, cfg.model_type, cfg.num_layers,
             torch_dtype, path)
    return model.eval(), cfg
