"""ModelConfig: the shape of a decoder-only model, from a Hugging Face config.json or GGUF metadata.

Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral) carry a MoEConfig: which layers route, how many
experts, the router's rule and the experts' sizes.

Both config.json dialects are accepted: transformers 4 (top-level `rope_theta`, `rope_scaling`,
`torch_dtype`) and transformers 5 (`rope_parameters`, `dtype`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from rtp_llm.errors import CheckpointError, MissingFileError, UnknownArchitectureError

# HF architecture -> upstream RTP-LLM model_type name.
ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen_3",
    "Qwen2ForCausalLM": "qwen_2",
    "LlamaForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "qwen_3_moe",
    "Qwen2MoeForCausalLM": "qwen_2_moe",
    "MixtralForCausalLM": "mixtral",
}
# The same decoders without the LM head: a base model (its hidden states: embeddings) or a classification head on
# the last token (cross-encoders, rerankers). Their checkpoints are read with --runner pooling.
HEADLESS = {"Qwen3Model": "qwen_3", "Qwen2Model": "qwen_2", "LlamaModel": "llama"}
CLASSIFIERS = {"Qwen3ForSequenceClassification": "qwen_3", "Qwen2ForSequenceClassification": "qwen_2",
               "LlamaForSequenceClassification": "llama"}
# Accepted --model_type spellings (upstream's first) -> canonical.
MODEL_TYPES = {"qwen_3": "qwen_3", "qwen3": "qwen_3", "qwen_2": "qwen_2", "qwen2": "qwen_2", "llama": "llama",
               "qwen_3_moe": "qwen_3_moe", "qwen3_moe": "qwen_3_moe", "qwen_2_moe": "qwen_2_moe",
               "qwen2_moe": "qwen_2_moe", "mixtral": "mixtral"}
GGUF_ARCHITECTURES = {"qwen3": "qwen_3", "qwen2": "qwen_2", "llama": "llama", "qwen3moe": "qwen_3_moe",
                      "qwen2moe": "qwen_2_moe"}
_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


def parse_dtype(name: str | None, default: torch.dtype = torch.float32) -> torch.dtype:
    if name is None or name == "auto":
        return default
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[str(name).replace("torch.", "")]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; use auto, float32, bfloat16 or float16") from None


def canonical_model_type(model_type: str) -> str:
    try:
        return MODEL_TYPES[model_type]
    except KeyError:
        raise UnknownArchitectureError(
            f"unknown model_type {model_type!r}; supported: {', '.join(sorted(set(MODEL_TYPES.values())))}") from None


@dataclass
class RopeConfig:
    theta: float = 10000.0
    type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf(cls, cfg: dict) -> "RopeConfig":
        params = dict(cfg.get("rope_parameters") or {})
        scaling = cfg.get("rope_scaling") or {}
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        merged = {**scaling, **params}
        rope_type = merged.get("rope_type", merged.get("type", "default")) or "default"
        if rope_type not in ("default", "linear", "llama3"):
            raise CheckpointError(f"unsupported RoPE scaling type {rope_type!r}; supported: default, linear, llama3")
        rope = cls(theta=float(theta), type=rope_type)
        if rope_type in ("linear", "llama3"):
            rope.factor = float(merged["factor"])
        if rope_type == "llama3":
            rope.low_freq_factor = float(merged["low_freq_factor"])
            rope.high_freq_factor = float(merged["high_freq_factor"])
            rope.original_max_position_embeddings = int(merged["original_max_position_embeddings"])
        return rope


@dataclass
class MoEConfig:
    """The sparse MLP blocks: softmax over every expert's router logit, the top_k largest (torch.topk's order and
    ties), renormalised to sum 1 where `renormalize`; each token's output is the sum of its experts' outputs times
    their weights, in ascending expert order. Qwen rounds the weights to the model's dtype before the products
    (`weights_in_model_dtype`); Mixtral multiplies by the float32 weights. Qwen2-MoE adds a shared expert scaled by
    sigmoid(shared_expert_gate(x))."""
    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    renormalize: bool
    weights_in_model_dtype: bool
    sparse_step: int = 1  # layer i routes when (i + 1) % sparse_step == 0 and i is not in mlp_only_layers
    mlp_only_layers: tuple[int, ...] = ()
    shared_intermediate_size: int = 0  # 0: no shared expert

    def __post_init__(self):
        if not 1 <= self.top_k <= self.num_experts:
            raise CheckpointError(f"num_experts_per_tok ({self.top_k}) must be between 1 and the number of experts "
                                  f"({self.num_experts})")
        if self.sparse_step < 1:
            raise CheckpointError(f"decoder_sparse_step must be at least 1, got {self.sparse_step}")

    def routes(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers and (layer + 1) % self.sparse_step == 0

    @classmethod
    def from_gguf(cls, meta: dict, arch: str, model_type: str) -> Optional["MoEConfig"]:
        """llama.cpp's metadata: every layer routes; its graph renormalises Qwen3-MoE's and Mixtral's top-k weights
        and not Qwen2-MoE's."""
        p = f"{arch}."
        experts = int(meta.get(p + "expert_count") or 0)
        if not experts:
            return None
        scale = meta.get(p + "expert_weights_scale")
        if scale not in (None, 0, 0.0, 1, 1.0):
            raise CheckpointError(f"GGUF {p}expert_weights_scale = {scale}: scaled expert weights are not supported")
        inter = meta.get(p + "expert_feed_forward_length") or meta[p + "feed_forward_length"]
        return cls(num_experts=experts, top_k=int(meta[p + "expert_used_count"]), intermediate_size=int(inter),
                   renormalize=model_type != "qwen_2_moe", weights_in_model_dtype=model_type != "mixtral",
                   shared_intermediate_size=int(meta.get(p + "expert_shared_feed_forward_length") or 0))

    @classmethod
    def from_hf(cls, cfg: dict, model_type: str) -> Optional["MoEConfig"]:
        if model_type == "mixtral":
            return cls(num_experts=int(cfg["num_local_experts"]), top_k=int(cfg.get("num_experts_per_tok", 2)),
                       intermediate_size=int(cfg["intermediate_size"]), renormalize=True,
                       weights_in_model_dtype=False)
        # transformers 5 writes Qwen-MoE's num_experts as num_local_experts
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        if model_type not in ("qwen_3_moe", "qwen_2_moe") or not experts:
            return None
        return cls(num_experts=experts, top_k=int(cfg["num_experts_per_tok"]),
                   intermediate_size=int(cfg["moe_intermediate_size"]),
                   renormalize=bool(cfg.get("norm_topk_prob", False)), weights_in_model_dtype=True,
                   sparse_step=int(cfg.get("decoder_sparse_step", 1)),
                   mlp_only_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()),
                   shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0)
                   if model_type == "qwen_2_moe" else 0)


@dataclass
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    rope: RopeConfig = field(default_factory=RopeConfig)
    dtype: torch.dtype = torch.float32  # the checkpoint's own dtype ("auto" resolves to it)
    bos_token_id: Optional[int] = None
    eos_token_ids: list[int] = field(default_factory=list)
    moe: Optional[MoEConfig] = None
    # What follows the final norm: "lm" (the vocabulary's logits), "none" (a base model: hidden states only) or
    # "score" (num_labels logits of the last token, HF's *ForSequenceClassification). classifier_from_token: a
    # causal LM read as a one-label classifier from its LM head's rows for these tokens (["no", "yes"]: the
    # Qwen3-Reranker recipe, vLLM's hf_overrides of the same name).
    head: str = "lm"
    num_labels: int = 0
    classifier_from_token: Optional[list[str]] = None
    labels: list[str] = field(default_factory=list)  # each label's name (id2label; LABEL_i where it has none)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})")

    def routes(self, layer: int) -> bool:
        """Whether decoder layer `layer` has a sparse (mixture-of-experts) MLP."""
        return self.moe is not None and self.moe.routes(layer)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    # --- Hugging Face config.json ----------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], model_type: str | None = None) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        every = {**ARCHITECTURES, **HEADLESS, **CLASSIFIERS}
        known = [a for a in archs if a in every]
        if model_type is not None:
            mt = canonical_model_type(model_type)
            arch = next((a for a in known if every[a] == mt), next(a for a, t in ARCHITECTURES.items() if t == mt))
        else:
            if not known:
                raise UnknownArchitectureError(
                    f"unknown architecture {archs or cfg.get('model_type')!r}; supported: "
                    f"{', '.join(every)} (or pass --model_type, e.g. qwen_3 | qwen_2 | llama)")
            arch = known[0]
            mt = every[arch]
        head = "none" if arch in HEADLESS else "score" if arch in CLASSIFIERS else "lm"
        if cfg.get("classifier_from_token") is not None:
            head = "lm"  # the classifier is read from the LM head's rows (rtp_llm/pooling/pooler.py)
        from_token = cfg.get("classifier_from_token")
        if from_token is not None and (arch not in CLASSIFIERS or not isinstance(from_token, list)
                                       or len(from_token) != 2):
            raise CheckpointError("classifier_from_token takes two tokens ([\"no\", \"yes\"]) with a "
                                  "*ForSequenceClassification architecture (vLLM's hf_overrides)")
        num_labels = 1 if from_token else int(cfg.get("num_labels") or len(cfg.get("id2label") or {}) or
                                              (2 if head == "score" else 0))
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            kv_heads = int(cfg.get("num_key_value_heads") or heads)
            eos = cfg.get("eos_token_id")
            attention_bias = bool(cfg.get("attention_bias", False))
            return cls(
                architecture=arch,
                model_type=mt,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases and none on o_proj; Llama / Qwen3 follow attention_bias.
                qkv_bias=True if mt in ("qwen_2", "qwen_2_moe") else attention_bias,
                o_bias=False if mt in ("qwen_2", "qwen_2_moe") else attention_bias,
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                qk_norm=mt in ("qwen_3", "qwen_3_moe"),
                rope=RopeConfig.from_hf(cfg),
                dtype=parse_dtype(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
                moe=MoEConfig.from_hf(cfg, mt),
                head=head,
                num_labels=num_labels,
                classifier_from_token=from_token,
                labels=_labels(cfg.get("id2label") or {}, num_labels),
            )
        except KeyError as exc:
            raise CheckpointError(f"config.json is missing the field {exc.args[0]!r}") from None

    @classmethod
    def from_hf_dir(cls, path: str, model_type: str | None = None, overrides: dict | None = None) -> "ModelConfig":
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise MissingFileError(f"no config.json in {path}")
        with open(cfg_path) as f:
            return cls.from_hf_dict({**json.load(f), **(overrides or {})}, model_type)

    # --- GGUF metadata ------------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], tensor_names: set[str],
                           model_type: str | None = None) -> "ModelConfig":
        gguf_arch = meta.get("general.architecture")
        if model_type is not None:
            mt = canonical_model_type(model_type)
        elif gguf_arch in GGUF_ARCHITECTURES:
            mt = GGUF_ARCHITECTURES[gguf_arch]
        else:
            raise UnknownArchitectureError(
                f"unknown GGUF architecture {gguf_arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)}")
        if mt == "llama" and int(meta.get(f"{gguf_arch}.expert_count") or 0):
            mt = "mixtral"  # llama.cpp writes Mixtral as a llama with experts
        arch = next(a for a, t in ARCHITECTURES.items() if t == mt)
        p = f"{gguf_arch}."
        try:
            hidden = int(meta[p + "embedding_length"])
            heads = int(meta[p + "attention.head_count"])
            kv_heads = int(meta.get(p + "attention.head_count_kv") or heads)
            vocab = int(meta.get(p + "vocab_size") or len(meta["tokenizer.ggml.tokens"]))
            rope = RopeConfig(theta=float(meta.get(p + "rope.freq_base", 10000.0)))
            scaling = meta.get(p + "rope.scaling.type")
            if scaling == "linear":
                rope.type, rope.factor = "linear", float(meta[p + "rope.scaling.factor"])
            elif scaling not in (None, "none"):
                raise CheckpointError(f"unsupported GGUF RoPE scaling {scaling!r}")
            eos = meta.get("tokenizer.ggml.eos_token_id")
            return cls(
                architecture=arch,
                model_type=mt,
                vocab_size=vocab,
                hidden_size=hidden,
                intermediate_size=int(meta[p + "feed_forward_length"]),
                num_layers=int(meta[p + "block_count"]),
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=int(meta.get(p + "attention.key_length") or hidden // heads),
                rms_norm_eps=float(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-6)),
                max_position_embeddings=int(meta.get(p + "context_length", 4096)),
                tie_word_embeddings="output.weight" not in tensor_names,
                qkv_bias="blk.0.attn_q.bias" in tensor_names,
                o_bias="blk.0.attn_output.bias" in tensor_names,
                qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
                rope=rope,
                dtype=torch.float32,
                bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
                eos_token_ids=[] if eos is None else [int(eos)],
                moe=MoEConfig.from_gguf(meta, gguf_arch, mt),
            )
        except KeyError as exc:
            raise CheckpointError(f"GGUF metadata is missing {exc.args[0]!r}") from None


def _labels(id2label: dict, n: int) -> list[str]:
    """HF's id2label (its keys strings once saved as JSON) as names by index."""
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]
