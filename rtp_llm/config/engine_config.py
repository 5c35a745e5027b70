"""EngineConfig: how the engine runs a model (limits, KV sizing, scheduling, device)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from rtp_llm.config.speculative_config import SpeculativeConfig


@dataclass
class EngineConfig:
    model: Optional[str] = None             # HF directory or .gguf file; None = the embedded default model
    tokenizer: Optional[str] = None         # defaults to the model path
    model_type: Optional[str] = None        # qwen_3 | qwen_2 | llama | *_moe | mixtral; None: the checkpoint
    dtype: str = "auto"
    quantization: str = "auto"              # auto: GGUF blocks as stored; none: dequantize; int8: per-channel int8
    device: str = "cpu"
    max_model_len: Optional[int] = None     # None = the model's max_position_embeddings
    max_num_seqs: int = 128  # vLLM's CPU server default: concurrency under load, not a queue
    max_num_batched_tokens: int = 2048
    max_prefill_chunk: Optional[int] = None  # longest prefill chunk per sequence per step; None = the token budget
    block_size: Optional[int] = None       # None = the device's default (128 on CPU and NPU; 16 on CUDA)
    num_blocks: Optional[int] = None        # explicit KV block count (overrides the memory settings)
    kv_cache_memory_gb: Optional[float] = None  # KV bytes; None: 1 GiB on CPU, kv_cache_memory_fraction elsewhere
    kv_cache_memory_fraction: float = 0.9   # of free accelerator memory after weights
    enable_prefix_caching: bool = True      # upstream's REUSE_CACHE
    attention_backend: Optional[str] = None  # None = the device's default
    max_queue_len: int = 1024               # waiting requests beyond this are refused
    max_logprobs: int = 20                  # most top logprobs a request may ask (vLLM's); -1 = no cap (whole vocab)
    allow_pickle: bool = False
    seed: int = 0
    tp_size: int = 1                        # tensor-parallel ranks (rtp_llm/distributed/)
    tp_timeout_s: float = 120.0             # a collective waiting longer than this fails (a hung rank)
    tp_heartbeat_timeout_s: float = 10.0    # a worker silent this long is reported dead
    # Speculative decoding: vLLM's speculative_config (a JSON string or a dict); None = off. Read into
    # `speculative` (config/speculative_config.py).
    speculative_config: Optional[Union[str, dict]] = None
    # What the engine runs the model for: generate (the next token), pooling (hidden states: embeddings, scores;
    # rtp_llm/pooling/), or auto (pooling for a checkpoint without an LM head: *Model, *ForSequenceClassification,
    # classifier_from_token). vLLM's older --task spellings embed / score / classify mean pooling.
    runner: str = "auto"
    pooler_config: Optional[Union[str, dict]] = None  # vLLM's: {"pooling_type": "MEAN", "normalize": true}
    hf_overrides: Optional[Union[str, dict]] = None   # vLLM's: keys merged into the checkpoint's config.json
    # LoRA adapters (rtp_llm/lora/, vLLM's flags): resident at once (a step holds at most this many), the largest
    # rank, kept on the host (default max_loras), and adapters loaded at start {name: path}.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None
    lora_modules: Optional[dict] = None
    # Settings only one device reads, by name (e.g. "cpu_gemv_weights"); that device validates them.
    device_options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        checks = [
            ("max_num_seqs", self.max_num_seqs >= 1),
            ("max_num_batched_tokens", self.max_num_batched_tokens >= 1),
            ("block_size", self.block_size is None or self.block_size >= 1),
            ("max_queue_len", self.max_queue_len >= 1),
            ("max_logprobs", self.max_logprobs >= -1),
            ("max_prefill_chunk", self.max_prefill_chunk is None or self.max_prefill_chunk >= 1),
            ("num_blocks", self.num_blocks is None or self.num_blocks >= 2),
            ("max_model_len", self.max_model_len is None or self.max_model_len >= 1),
            ("kv_cache_memory_fraction", 0 < self.kv_cache_memory_fraction <= 1),
            ("tp_size", self.tp_size >= 1),
            ("tp_timeout_s", self.tp_timeout_s > 0),
            ("tp_heartbeat_timeout_s", self.tp_heartbeat_timeout_s > 0),
            ("quantization", self.quantization in ("auto", "none", "int8")),
            ("runner", self.runner in ("auto", "generate", "pooling", "embed", "score", "classify")),
            ("max_loras", self.max_loras >= 1),
            ("max_lora_rank", self.max_lora_rank >= 1),
            ("max_cpu_loras", self.max_cpu_loras is None or self.max_cpu_loras >= 1),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"invalid {name}: {getattr(self, name)!r}")
        self.speculative: Optional[SpeculativeConfig] = SpeculativeConfig.parse(self.speculative_config)
        if self.runner in ("embed", "score", "classify"):
            self.runner = "pooling"
        if isinstance(self.hf_overrides, str):
            import json

            self.hf_overrides = json.loads(self.hf_overrides) if self.hf_overrides.strip() else None
        if self.hf_overrides is not None and not isinstance(self.hf_overrides, dict):
            raise ValueError(f"invalid hf_overrides: {self.hf_overrides!r} (a JSON object)")

    @property
    def prefill_chunk(self) -> int:
        return min(self.max_prefill_chunk or self.max_num_batched_tokens, self.max_num_batched_tokens)
