"""The preflight of a model and its serving flags on a device, before anything is loaded: the dtype it will run in,
the shapes the device's kernels take (head dim, KV block size), which GGUF formats stay quantized, the
tensor-parallel split, the memory plan; then one minimal generate through the engine."""

from __future__ import annotations

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.doctor.checks import FAIL, GiB, PASS, WARN, Check, ok


def preflight(config: EngineConfig, device_name: str, generate: bool = True) -> list[Check]:
    from rtp_llm.device import get_device
    from rtp_llm.errors import CheckpointError
    from rtp_llm.models.default_model import with_default_model
    from rtp_llm.models.gguf_reader import shared_gguf_files
    from rtp_llm.models.loader import find_gguf, load_config
    from rtp_llm.models.registry import stored_dtype

    config = with_default_model(config)
    device = get_device(device_name, options=config.device_options)
    out: list[Check] = []
    with shared_gguf_files():
        try:
            cfg = load_config(config.model, config.model_type, config.hf_overrides)
        except (CheckpointError, OSError, ValueError) as exc:
            return [Check("model", FAIL, str(exc), "--model: a Hugging Face directory or a .gguf file")]
        out.append(ok("model", f"{config.model}: {cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
                               f"{cfg.num_heads}/{cfg.num_kv_heads} heads of {cfg.head_dim}, vocab {cfg.vocab_size}"))
        stored = stored_dtype(config.model, cfg)
        try:
            dtype = device.model_dtype(config.dtype, stored)
            out.append(ok("dtype", f"runs in {dtype} (the checkpoint loads as {stored}; --dtype {config.dtype})"))
        except ValueError as exc:
            out.append(Check("dtype", FAIL, str(exc), f"--dtype auto (the {device_name} chooses)"))
            dtype = None
        try:
            device.check_model(cfg)
            out.append(ok("kernel shapes", f"head dim {cfg.head_dim} is one the {device_name} attention takes"))
        except ValueError as exc:
            out.append(Check("kernel shapes", FAIL, str(exc), "serve this model on another device (--device cpu)"))
        block = config.block_size or device.default_block_size
        try:
            device.validate_block_size(block)
            out.append(ok("block size", f"KV blocks of {block} tokens"))
        except ValueError as exc:
            out.append(Check("block size", FAIL, str(exc), f"--block_size {device.default_block_size} (the default)"))
        gguf = find_gguf(config.model)
        if gguf and dtype is not None:
            out.append(_quantized_formats(gguf, config, device, dtype))
        out.append(_tensor_parallel(cfg, config.tp_size))
        if dtype is not None and not any(c.status == FAIL for c in out):
            out.append(_memory(config, device, block))
    if generate and not any(c.status == FAIL for c in out):
        out.append(_generate(config, device_name))
    return out


def _quantized_formats(gguf: str, config, device, dtype) -> Check:
    from rtp_llm.models.gguf_reader import open_gguf

    formats = sorted({t.tensor_type.name for t in open_gguf(gguf).tensor_list if len(t.shape) >= 2})
    ops = device.ops()
    if config.quantization == "none":
        return ok("weight formats", f"{', '.join(formats)}: dequantized at load (--quantization none)")
    kept = [f for f in formats if ops.runs_quantized(f, dtype)]
    chosen = [f for f in formats if f not in kept and ops.multiplies_quantized(f, dtype)]
    missing = [f for f in formats if f not in kept and f not in chosen and f not in ("F32", "F16", "BF16")]
    detail = f"kept as stored: {', '.join(kept) or 'none'}"
    if chosen:  # the CPU without AVX-512: its block kernel is slower than the float32 copy of the same values
        detail += (f"; dequantized by choice: {', '.join(chosen)} (the dense kernels are faster here; "
                   "--cpu_gguf_blocks on keeps them, in less memory)")
    if missing:
        return Check("weight formats", WARN, detail + f"; no {device.name} kernel, dequantized to {dtype}: "
                     f"{', '.join(missing)}", "expected: they take their dequantized size (see the memory line)")
    return ok("weight formats", detail)


def _tensor_parallel(cfg, tp_size: int) -> Check:
    from rtp_llm.errors import ShardingError
    from rtp_llm.models.sharding import TPShard

    try:
        for rank in range(tp_size):
            TPShard.plan(cfg, tp_size, rank)
    except ShardingError as exc:
        return Check("tensor parallel", FAIL, str(exc), "a --tp_size that divides the KV heads")
    return ok("tensor parallel", f"tp_size {tp_size}" + (" (no split)" if tp_size == 1 else " splits evenly"))


def _memory(config, device, block: int) -> Check:
    from rtp_llm.models.registry import memory_plan

    weights, kv = memory_plan(config, device, block)
    free, total = device.memory_info()
    detail = (f"weights {weights / GiB:.2f} GiB + KV cache {kv / GiB:.2f} GiB = {(weights + kv) / GiB:.2f} GiB; "
              f"{free / GiB:.1f} of {total / GiB:.1f} GiB free on the {device.name}")
    try:
        device.check_fits(weights, kv)
    except ValueError as exc:
        return Check("memory", FAIL, str(exc), "lower --kv_cache_memory_gb / --num_blocks, or --quantization int8")
    if weights + kv > free:
        return Check("memory", FAIL, detail, "lower --kv_cache_memory_gb / --kv_cache_memory_fraction, or free the "
                                             "device")
    return ok("memory", detail)


def _generate(config, device_name: str) -> Check:
    """Two greedy tokens of a four-token prompt through the whole engine, with a small KV cache."""
    from dataclasses import replace

    from rtp_llm.llm import LLM
    from rtp_llm.sampling import SamplingParams

    small = replace(config, device=device_name, max_model_len=64, num_blocks=64 // 16 + 2, kv_cache_memory_gb=None,
                    tp_size=1, enable_prefix_caching=False)
    try:
        with LLM(**{k: getattr(small, k) for k in small.__dataclass_fields__}) as llm:
            out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                               use_tqdm=False)[0].outputs[0]
    except Exception as exc:  # the point of the check: whatever stops the engine, said in one line
        return Check("generate", FAIL, f"{type(exc).__name__}: {exc}"[:400], "see the lines above; rerun with "
                                                                               "--log_level debug")
    if len(out.token_ids) != 2:
        return Check("generate", FAIL, f"the engine returned {len(out.token_ids)} tokens for 2", "report it")
    return ok("generate", f"2 greedy tokens on the {device_name}: {out.token_ids}")


__all__ = ["preflight", "PASS", "WARN", "FAIL"]
