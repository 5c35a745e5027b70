"""Tiny random checkpoints made with transformers, saved as safetensors, for parity tests."""

from __future__ import annotations

import torch

VARIANTS = {
    # name: (architecture, config overrides)
    "qwen3_gqa2_headdim32_untied": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                                  tie_word_embeddings=False)),
    "qwen3_mha_tied": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                                     tie_word_embeddings=True)),
    "qwen2_gqa4_bias_untied": ("qwen2", dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)),
    "llama_gqa4_tied_attnbias": ("llama", dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                                                attention_bias=True)),
    "llama_mha_llama3_rope": ("llama", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                             rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                                                  original_max_position_embeddings=64))),
    "llama_gqa2_linear_rope": ("llama", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                              rope_parameters=dict(rope_type="linear", rope_theta=10000.0,
                                                                   factor=2.0))),
}

# The NPU tests' models: head dim 128, the fused attention kernel's documented TND case, with the real models'
# head geometry (Qwen3 and Llama 3: 128; Qwen2.5 from 1.5B: 128, GQA), and head dim 64 (SmolLM2, Qwen2.5-0.5B),
# which only some CANN versions take in TND.
NPU_VARIANTS = {
    "qwen3_hd128": ("qwen3", dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                  tie_word_embeddings=False)),
    "qwen2_hd128": ("qwen2", dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
                                  tie_word_embeddings=False)),
    "llama_hd128": ("llama", dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=1,
                                  tie_word_embeddings=True)),
    "qwen3_hd64": ("qwen3", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                 tie_word_embeddings=False)),
    "qwen2_hd64": ("qwen2", dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                 tie_word_embeddings=False)),
    "llama_hd64": ("llama", dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=1,
                                 tie_word_embeddings=True)),
    "qwen3_moe_hd64": ("qwen3_moe", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                         num_experts=6, num_experts_per_tok=2, moe_intermediate_size=64,
                                         norm_topk_prob=True, tie_word_embeddings=False)),
    "qwen2_moe_hd64": ("qwen2_moe", dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                         num_experts=5, num_experts_per_tok=2, moe_intermediate_size=64,
                                         shared_expert_intermediate_size=96, tie_word_embeddings=False)),
    "mixtral_hd64": ("mixtral", dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                     num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                                     tie_word_embeddings=True)),
}

# Tensor-parallel shapes (tests/distributed): fewer KV heads than ranks; SmolLM2's uneven 9 query / 3 KV
# heads; odd intermediate and vocabulary sizes (uneven MLP split, padded logits gather); biases.
TP_VARIANTS = {
    "qwen3_kv1_tied": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                     tie_word_embeddings=True)),
    "llama_9h_3kv_odd": ("llama", dict(hidden_size=144, num_attention_heads=9, num_key_value_heads=3,
                                       intermediate_size=97, vocab_size=255, tie_word_embeddings=False,
                                       attention_bias=True, mlp_bias=True)),
    "qwen2_6h_3kv_bias": ("qwen2", dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3,
                                        tie_word_embeddings=False)),
}

# A tiny model over the real SmolLM2 tokenizer's whole vocabulary (49,152 ids), for what needs every token of the
# tokenizer to be sampleable: grammars force multi-character tokens (structured outputs, tool calls).
FULL_VOCAB_VARIANTS = {
    "llama_full_vocab": ("llama", dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=49152,
                                       tie_word_embeddings=True)),
}


# Mixture-of-experts shapes (tests/models/test_moe.py): top-k 1, 2 and 8; odd expert counts; sparse and dense layers
# mixed (decoder_sparse_step, mlp_only_layers); Qwen2-MoE's shared expert; Mixtral's renormalised top-2.
MOE_VARIANTS = {
    "qwen3_moe_top2_e5": ("qwen3_moe", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                            num_experts=5, num_experts_per_tok=2, moe_intermediate_size=32,
                                            tie_word_embeddings=False)),
    "qwen3_moe_top8_e9_norm_mixed": ("qwen3_moe", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                                       num_hidden_layers=3, num_experts=9, num_experts_per_tok=8,
                                                       moe_intermediate_size=24, norm_topk_prob=True,
                                                       mlp_only_layers=[1], tie_word_embeddings=True)),
    "qwen3_moe_top1_e7_step2": ("qwen3_moe", dict(num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                                                  num_experts=7, num_experts_per_tok=1, moe_intermediate_size=40,
                                                  decoder_sparse_step=2, tie_word_embeddings=False)),
    "qwen2_moe_shared": ("qwen2_moe", dict(num_attention_heads=4, num_key_value_heads=2, num_experts=6,
                                           num_experts_per_tok=2, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=64, tie_word_embeddings=False)),
    "mixtral_top2_e5": ("mixtral", dict(num_attention_heads=4, num_key_value_heads=2, num_local_experts=5,
                                        num_experts_per_tok=2, intermediate_size=64, tie_word_embeddings=False)),
}


def make_checkpoint(path, variant: str, seed: int = 0, overrides: dict | None = None):
    """Writes config.json + model.safetensors into path; returns the transformers model (float32, eval).
    overrides: config fields over the variant's (e.g. sizes of whole GGUF blocks)."""
    import transformers as tf

    arch, fields = {**VARIANTS, **NPU_VARIANTS, **TP_VARIANTS, **FULL_VOCAB_VARIANTS, **MOE_VARIANTS}[variant]
    config_cls, model_cls = {"qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM), "qwen2": (tf.Qwen2Config,
                                                                                       tf.Qwen2ForCausalLM),
                             "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                             "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
                             "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM),
                             "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM)}[arch]
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    base.update(fields)
    base.update(overrides or {})
    torch.manual_seed(seed)
    model = model_cls(config_cls(**base)).eval()
    # Random init leaves some parameters (norms, biases) at constants; perturb them so a wrong
    # mapping of any tensor shows in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
            elif arch in ("qwen3_moe", "qwen2_moe", "mixtral"):
                # the init's tiny router logits make every routing a near tie, and its tiny experts add little to
                # the residual: routers scaled until choices are clear, experts until a wrong choice shows
                p.mul_(40.0 if name.endswith(("gate.weight", "shared_expert_gate.weight")) and "proj" not in name
                       else 4.0 if ".experts." in name or "shared_expert." in name else 1.0)
    model.save_pretrained(str(path))
    return model
