"""Command-line flags of start_server, each with an environment-variable twin named as upstream
RTP-LLM names it (CHECKPOINT_PATH, MODEL_TYPE, TOKENIZER_PATH, MAX_SEQ_LEN, SEQ_SIZE_PER_BLOCK,
REUSE_CACHE, ...). The command line wins over the environment, which wins over the default.
A bad value, from either, is a one-line error naming the flag or variable.

The one table of settings: a flag that configures the engine names its EngineConfig field and takes that field's
default from EngineConfig itself, and engine_config() builds the EngineConfig from the resolved flags.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.errors import ConfigError


def _bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {v!r}")


def _opt_int(v: str) -> Optional[int]:
    return None if str(v).lower() in ("", "none", "auto") else int(v)


def _str_list(v: str) -> list[str]:
    """A JSON list of strings (vLLM's form) or comma-separated values."""
    s = str(v).strip()
    if s.startswith("["):
        import json

        items = json.loads(s)
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ValueError("expected a JSON list of strings")
        return items
    return [x.strip() for x in s.split(",") if x.strip()]


def _opt_str(v: str) -> Optional[str]:
    return None if str(v).lower() in ("", "none") else str(v)


def _opt_float(v: str) -> Optional[float]:
    return None if str(v).lower() in ("", "none", "auto") else float(v)


def _lora_modules(v: str) -> Optional[dict]:
    """vLLM's --lora_modules: name=path items (comma-separated), or a JSON list of {"name", "path",
    "base_model_name"} objects -> {name: path}."""
    import json

    s = str(v).strip()
    if not s or s.lower() == "none":
        return None
    items = json.loads(s) if s.startswith("[") else [x.strip() for x in s.split(",") if x.strip()]
    out: dict = {}
    for item in items:
        if isinstance(item, dict):
            name, path = item.get("name"), item.get("path")
        else:
            name, _, path = str(item).partition("=")
        if not name or not path or name in out:
            raise ValueError(f"expected name=path items (or JSON objects with name and path), each name once: "
                             f"{item!r}")
        out[name] = path
    return out


def _speculative(v: str) -> Optional[str]:
    """vLLM's --speculative_config JSON, checked here so a bad one is a one-line error naming the flag."""
    from rtp_llm.config.speculative_config import SpeculativeConfig

    return v if SpeculativeConfig.parse(_opt_str(v)) is not None else None


@dataclass(frozen=True)
class Flag:
    name: str
    env: str
    type: Callable[[str], Any]
    default: Any
    help: str
    aliases: tuple[str, ...] = ()
    choices: Optional[tuple[str, ...]] = None
    engine: Optional[str] = None  # the EngineConfig field it sets ("device_options.<key>": a device's setting)


def _engine_flag(name: str, env: str, type_: Callable[[str], Any], help_: str, field: Optional[str] = None,
                 **kw) -> Flag:
    """A flag that sets EngineConfig.<field> (default: the flag's name), with that field's default."""
    field = field or name
    return Flag(name, env, type_, EngineConfig.__dataclass_fields__[field].default, help_, engine=field, **kw)


FLAGS = [
    _engine_flag("checkpoint_path", "CHECKPOINT_PATH", str,
                 "model to serve: a Hugging Face directory or a .gguf file (default: the embedded "
                 "SmolLM2-135M-Instruct)", "model", aliases=("--model",)),
    _engine_flag("tokenizer_path", "TOKENIZER_PATH", str, "tokenizer directory or .gguf (default: the model's)",
                 "tokenizer"),
    _engine_flag("model_type", "MODEL_TYPE", str,
                 "qwen_3 | qwen_2 | llama | qwen_3_moe | qwen_2_moe | mixtral (default: from the checkpoint)"),
    _engine_flag("dtype", "DTYPE", str, "weight dtype", choices=("auto", "float32", "bfloat16", "float16")),
    _engine_flag("quantization", "QUANTIZATION", str,
                 "auto = keep a GGUF's block formats in memory where the device multiplies them (CPU float32: Q8_0, "
                 "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; NPU: all but Q6_K), none = dequantize at load, int8 = "
                 "linear layers as per-output-channel int8 made at load (any checkpoint)",
                 choices=("auto", "none", "int8")),
    _engine_flag("max_model_len", "MAX_SEQ_LEN", _opt_int, "longest prompt + output in tokens (default: the model's)"),
    _engine_flag("max_num_seqs", "MAX_NUM_SEQS", int, "sequences per step"),
    _engine_flag("max_num_batched_tokens", "MAX_NUM_BATCHED_TOKENS", int, "tokens per step"),
    _engine_flag("max_prefill_chunk", "MAX_PREFILL_CHUNK", _opt_int, "longest prefill chunk per sequence per step"),
    _engine_flag("block_size", "SEQ_SIZE_PER_BLOCK", _opt_int,
                 "tokens per KV block (default 128 on CPU and NPU, 16 on CUDA)"),
    _engine_flag("num_blocks", "KV_CACHE_BLOCKS", _opt_int, "KV blocks (overrides kv_cache_memory_gb)"),
    _engine_flag("kv_cache_memory_gb", "KV_CACHE_MEM_GB", _opt_float, "KV cache size in GiB (CPU default 1)"),
    _engine_flag("enable_prefix_caching", "REUSE_CACHE", _bool, "reuse cached prompt prefixes (1/0)"),
    _engine_flag("max_queue_len", "MAX_QUEUE_LEN", int, "waiting requests before new ones get 503"),
    _engine_flag("max_logprobs", "MAX_LOGPROBS", int,
                 "most top logprobs a request may ask for each token (logprobs, top_logprobs, prompt_logprobs); -1 = "
                 "no cap, so -1 in a request (the whole vocabulary) is allowed"),
    # "auto" is the machine's device (rtp_llm.device.resolve_device); EngineConfig itself defaults to the CPU.
    Flag("device", "DEVICE", str, "auto", "device to run on", choices=("auto", "cpu", "cuda", "npu"),
         engine="device"),
    _engine_flag("tp_size", "TP_SIZE", int,
                 "tensor-parallel ranks; on one machine the extra ranks are spawned, across machines set torchrun's "
                 "MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK/LOCAL_RANK and run this command on every rank"),
    _engine_flag("tp_timeout", "TP_TIMEOUT", float, "seconds a tensor-parallel collective may wait (a hung rank)",
                 "tp_timeout_s"),
    _engine_flag("tp_heartbeat_timeout", "TP_HEARTBEAT_TIMEOUT", float,
                 "seconds without a worker heartbeat before the server reports that rank dead and exits",
                 "tp_heartbeat_timeout_s"),
    _engine_flag("speculative_config", "SPECULATIVE_CONFIG", _speculative,
                 "speculative decoding, vLLM's JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                 "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5} or {\"method\": \"draft_model\", \"model\": "
                 "PATH, \"num_speculative_tokens\": 4}; outputs are the same bits as without it (docs/speculative.md)"),
    _engine_flag("enable_lora", "ENABLE_LORA", _bool, "serve LoRA adapters beside the base model (docs/lora.md)"),
    _engine_flag("lora_modules", "LORA_MODULES", _lora_modules,
                 "adapters loaded at start: name=path,... or vLLM's JSON [{\"name\", \"path\"}]; a request's "
                 "`model` picks one by name"),
    _engine_flag("max_loras", "MAX_LORAS", int, "adapters resident at once (a step holds at most this many)"),
    _engine_flag("max_lora_rank", "MAX_LORA_RANK", int, "the largest adapter rank accepted"),
    _engine_flag("max_cpu_loras", "MAX_CPU_LORAS", _opt_int, "adapters kept loaded on the host (default max_loras)"),
    _engine_flag("runner", "RUNNER", str,
                 "what the model runs for: generate (chat and completions), pooling (embeddings, score, rerank: "
                 "docs/pooling.md); auto = pooling for a checkpoint without an LM head (*Model, "
                 "*ForSequenceClassification); vLLM's --task embed | score | classify mean pooling",
                 aliases=("--task",), choices=("auto", "generate", "pooling", "embed", "score", "classify")),
    _engine_flag("pooler_config", "POOLER_CONFIG", _opt_str,
                 "pooling runner, vLLM's JSON: {\"pooling_type\": \"MEAN\" | \"CLS\" | \"LAST\", \"normalize\": "
                 "true}; default: the checkpoint's sentence-transformers files, else last token"),
    _engine_flag("hf_overrides", "HF_OVERRIDES", _opt_str,
                 "vLLM's JSON merged into the checkpoint's config.json, e.g. a Qwen3-Reranker as a classifier: "
                 "{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"classifier_from_token\": [\"no\", "
                 "\"yes\"]}"),
    Flag("cpu_gemv_weights", "CPU_GEMV_WEIGHTS", str, "auto",
         "CPU, where linear layers run on oneDNN (bf16 without avx512_bf16; fp32 without AVX-512): also keep plain "
         "weight copies for the GEMV kernel of steps of few rows (it streams weights faster than the packed GEMM; "
         "costs the weights' size again); auto = when they fit in 1/4 of free memory",
         choices=("auto", "on", "off"), engine="device_options.cpu_gemv_weights"),
    Flag("cpu_gguf_blocks", "CPU_GGUF_BLOCKS", str, "auto",
         "CPU, quantization auto: keep a GGUF's block formats in memory (on), or dequantize them at load (off); auto "
         "= keep them where a block kernel runs (AVX-512 or AVX2), else dequantize (the same values, the float32 "
         "weights' memory)",
         choices=("auto", "on", "off"), engine="device_options.cpu_gguf_blocks"),
    Flag("npu_graph", "NPU_GRAPH", str, "on",
         "NPU: decode steps replay an NPU graph captured per batch size (1, 2, 4 .. 128, up to max_num_seqs), the "
         "fused attention's lengths updated per step; prefill and mixed steps stay eager. off = every step eager",
         choices=("on", "off"), engine="device_options.npu_graph"),
    Flag("host", "HOST", str, "127.0.0.1", "address to listen on"),
    Flag("port", "START_PORT", int, 8000, "port to listen on"),
    Flag("api_key", "API_KEY", str, None, "require 'Authorization: Bearer <key>' on every route but /health"),
    Flag("served_model_name", "SERVED_MODEL_NAME", str, None, "model name in the API (default: from the path)"),
    Flag("max_body_bytes", "MAX_BODY_BYTES", int, 1 << 20, "largest request body accepted"),
    Flag("allowed_origins", "ALLOWED_ORIGINS", _str_list, None,
         "CORS: origins allowed to call the API from a browser (JSON list or comma-separated, * for any); none = no "
         "CORS headers"),
    Flag("allowed_methods", "ALLOWED_METHODS", _str_list, ["*"], "CORS: allowed methods"),
    Flag("allowed_headers", "ALLOWED_HEADERS", _str_list, ["*"], "CORS: allowed request headers"),
    Flag("allow_credentials", "ALLOW_CREDENTIALS", _bool, False, "CORS: allow credentials"),
    Flag("chat_template", "CHAT_TEMPLATE", str, None,
         "a Jinja chat template (a file path or the template itself) replacing the model's"),
    Flag("tool_call_parser", "TOOL_CALL_PARSER", str, "auto",
         "how tool calls are read from answers (tool_choice auto): hermes = <tool_call>{json}</tool_call> (Qwen2.5, "
         "Qwen3), llama3_json = {\"name\", \"parameters\"} objects (Llama 3.1/3.2); auto = from the chat template "
         "when unambiguous, none = tool_choice auto refused",
         choices=("auto", "none", "hermes", "llama3_json")),
    Flag("reasoning_parser", "REASONING_PARSER", _opt_str, None,
         "split <think>...</think> into reasoning_content: qwen3 (the answer may open <think>), deepseek_r1 (the "
         "template opens it); none = no split", choices=("qwen3", "deepseek_r1")),
    Flag("allow_runtime_lora_updating", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", _bool, False,
         "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's switch, same environment variable)"),
    Flag("unknown_fields", "UNKNOWN_FIELDS", str, "reject",
         "a request field this server does not know: reject = a 400 naming it (OpenAI's behaviour), ignore = warn "
         "once per field and go on (vLLM's reading, for clients that add vendor fields)",
         choices=("reject", "ignore")),
    Flag("strict_json_schemas", "STRICT_JSON_SCHEMAS", _bool, True,
         "tool parameters and response_format schemas allow no property they do not name unless they say "
         "additionalProperties (what OpenAI's strict mode and vLLM's default grammar backend do); 0 = JSON Schema's "
         "own reading (unnamed properties allowed)"),
    Flag("shutdown_timeout", "SHUTDOWN_TIMEOUT", float, 30.0, "seconds in-flight requests get on SIGTERM/SIGINT"),
    Flag("stream_stall_timeout", "STREAM_STALL_TIMEOUT", float, 120.0,
         "seconds a streaming client may accept no data before its request is aborted (a stalled or vanished "
         "client); 0 = never"),
    _engine_flag("allow_pickle", "ALLOW_PICKLE", _bool, "allow pickle (.bin) checkpoints (runs their code)"),
    Flag("log_level", "LOG_LEVEL", str, "info", "logging level", choices=("debug", "info", "warning", "error")),
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rtp_llm.start_server",
        description="Serve a model over an OpenAI-compatible and RTP-LLM native HTTP API. Every flag has an "
                    "environment-variable twin; the command line wins.")
    for f in FLAGS:
        default = "none" if f.default is None else f.default
        p.add_argument(f"--{f.name}", *f.aliases, dest=f.name, default=None, metavar=f.env,
                       help=f"{f.help} [env {f.env}; default {default}]"
                            + (f" {{{', '.join(f.choices)}}}" if f.choices else ""))
    return p


def resolve(argv: Optional[list[str]] = None, environ: Optional[dict] = None) -> dict[str, Any]:
    """Flag values: command line > environment > default. Raises ConfigError with one line."""
    environ = os.environ if environ is None else environ
    ns = build_parser().parse_args(argv)
    out = {}
    for f in FLAGS:
        raw, source = getattr(ns, f.name), f"--{f.name}"
        if raw is None and environ.get(f.env) not in (None, ""):
            raw, source = environ[f.env], f.env
        if raw is None:
            out[f.name] = f.default
            continue
        try:
            value = f.type(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}={raw!r}: {exc}") from None
        if f.choices and value is not None and value not in f.choices:
            raise ConfigError(f"{source}={raw!r}: choose one of {', '.join(f.choices)}")
        out[f.name] = value
    return out


def engine_config(args: dict[str, Any], device: Optional[str] = None) -> EngineConfig:
    """The EngineConfig of resolved flags (resolve()); device: the flag's "auto" resolved to a device name."""
    kwargs: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for f in FLAGS:
        if f.engine is None:
            continue
        if f.engine.startswith("device_options."):
            options[f.engine.split(".", 1)[1]] = args[f.name]
        else:
            kwargs[f.engine] = args[f.name]
    if device is not None:
        kwargs["device"] = device
    return EngineConfig(**kwargs, device_options=options)
