"""Tiny llama-architecture GGUF files written with the `gguf` package, every matrix in one block format, with
the embedded default model's tokenizer (so that transformers can load the same file as a reference). The
32-element formats go through gguf's quantizer; the k-quants (which it cannot write) are random blocks whose
fp16 scales are set so that the weights have the size of the others'."""

from __future__ import annotations

import functools

import numpy as np

LAYERS = 2
# fp16 block scale for random k-quant blocks (weights ~0.1): Q4_K/Q5_K multiply it by a 6-bit scale and a 4/5-bit
# quant, Q6_K by an int8 scale and a 6-bit quant.
K_QUANT_SCALE = {"Q4_K": 3e-4, "Q5_K": 1.5e-4, "Q6_K": 4e-5}


def dims(fmt: str, head_dim_64: bool = False) -> tuple[int, int, int, int]:
    """(hidden, heads, kv heads, intermediate): k-quant rows are whole 256-element blocks; head_dim_64 gives the
    32-element formats a head dim the NPU's fused attention takes (the k-quant shapes have it already)."""
    if fmt in K_QUANT_SCALE:
        return 256, 4, 2, 512
    return (128, 2, 1, 256) if head_dim_64 else (64, 2, 1, 128)


def random_k_blocks(rng, fmt: str, rows: int, cols: int) -> np.ndarray:
    import gguf

    per, nbytes = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, fmt)]
    raw = rng.integers(0, 256, size=(rows * cols // per, nbytes), dtype=np.uint8)
    d = (K_QUANT_SCALE[fmt] * rng.uniform(0.5, 1.5, len(raw))).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if fmt == "Q6_K":
        raw[:, 208:210] = d
    else:
        raw[:, 0:2] = d
        raw[:, 2:4] = d  # dmin: the mins shift each sub-block by about its own spread
    return raw.reshape(rows, -1)


# The tokenizer's large arrays: files written without them (with_vocab=False) parse in milliseconds instead of
# seconds, for tests that pass the tokenizer in and load the weights several times.
VOCAB_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                "tokenizer.ggml.scores", "tokenizer.chat_template")


@functools.lru_cache(maxsize=1)
def _default_tokenizer_fields() -> dict:
    """The default model's tokenizer.* fields as (value, gguf types): gguf's reader takes seconds over its vocabulary,
    so a test process parses it once."""
    import gguf

    from rtp_llm.models.default_model import default_model_path

    src = gguf.GGUFReader(default_model_path())
    return {k: (f.contents(), list(f.types)) for k, f in src.fields.items() if k.startswith("tokenizer.")}


def write_tiny_gguf(path: str, fmt: str, seed: int = 0, head_dim_64: bool = False, with_vocab: bool = True,
                    overrides: dict[str, str] | None = None) -> str:
    """overrides: a 32-element format for some of each layer's matrices by GGUF name ({"attn_v": "Q8_0"}, as
    llama.cpp's k-quant mixes write them)."""
    import gguf

    fields = _default_tokenizer_fields()
    vocab = len(fields["tokenizer.ggml.tokens"][0])
    w = gguf.GGUFWriter(path, "llama")
    for key, (value, types) in fields.items():  # the tokenizer and its chat template, as stored
        if with_vocab or key not in VOCAB_FIELDS:
            w.add_key_value(key, value, types[0], types[-1] if len(types) > 1 else None)
    HIDDEN, HEADS, KV_HEADS, INTER = dims(fmt, head_dim_64)
    head_dim = HIDDEN // HEADS
    w.add_block_count(LAYERS)
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab)
    rng = np.random.default_rng(seed)
    qtype = getattr(gguf.GGMLQuantizationType, fmt)

    def matrix(name, rows, cols, scale):
        if fmt in K_QUANT_SCALE:
            w.add_tensor(name, random_k_blocks(rng, fmt, rows, cols), raw_dtype=qtype)
            return
        own = (overrides or {}).get(name.split(".")[-2]) if name.startswith("blk.") else None
        kind = getattr(gguf.GGMLQuantizationType, own) if own else qtype
        data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)

    def vector(name, n):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", vocab, HIDDEN, 1.0)
    vector("output_norm.weight", HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", HIDDEN)
        vector(p + "ffn_norm.weight", HIDDEN)
        matrix(p + "attn_q.weight", HEADS * head_dim, HIDDEN, 0.15)
        matrix(p + "attn_k.weight", KV_HEADS * head_dim, HIDDEN, 0.15)
        matrix(p + "attn_v.weight", KV_HEADS * head_dim, HIDDEN, 0.15)
        matrix(p + "attn_output.weight", HIDDEN, HEADS * head_dim, 0.15)
        matrix(p + "ffn_gate.weight", INTER, HIDDEN, 0.15)
        matrix(p + "ffn_up.weight", INTER, HIDDEN, 0.15)
        matrix(p + "ffn_down.weight", HIDDEN, INTER, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# A transformers mixture-of-experts model written as llama.cpp writes one (qwen3moe, qwen2moe, or Mixtral as a llama
# with experts): the 3-D ffn_{gate,up,down}_exps tensors, the router as ffn_gate_inp, Qwen2-MoE's shared expert.
_MOE_ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama"}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K permutation for its llama architecture: rows (head, half, pair) -> (head, pair, half)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_moe_gguf(path: str, hf, fmt: str, seed: int = 0) -> str:
    """Writes hf (a tiny transformers MoE model) with every matrix in block format `fmt` (the k-quants: random
    blocks), then sets hf's weights to the values gguf dequantizes from those blocks, so hf is the reference for the
    file. Vectors (norms, the shared expert's gate) stay F32."""
    import gguf
    import torch

    cfg = hf.config
    arch = _MOE_ARCH[cfg.model_type]
    rng = np.random.default_rng(seed)
    qtype = getattr(gguf.GGMLQuantizationType, fmt)
    w = gguf.GGUFWriter(path, arch)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_expert_feed_forward_length(inter)
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if getattr(cfg, "shared_expert_intermediate_size", 0):
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    state = hf.state_dict()
    dequantized = {}

    def matrix(gguf_name, hf_names, data):
        """data: [rows, cols] or [experts, rows, cols] float32; hf_names: where its dequantized values go back."""
        if fmt in K_QUANT_SCALE:
            lead = data.shape[:-1]
            raw = random_k_blocks(rng, fmt, int(np.prod(lead)), data.shape[-1]).reshape(*lead, -1)
        else:
            raw = gguf.quants.quantize(data, qtype)
        w.add_tensor(gguf_name, raw, raw_dtype=qtype)
        dequantized[gguf_name] = (hf_names, gguf.quants.dequantize(raw, qtype).reshape(data.shape))

    def vector(gguf_name, hf_name):
        w.add_tensor(gguf_name, state[hf_name].float().numpy().reshape(-1))

    def np_(name):
        return state[name].float().numpy()

    matrix("token_embd.weight", "model.embed_tokens.weight", np_("model.embed_tokens.weight"))
    vector("output_norm.weight", "model.norm.weight")
    if not cfg.tie_word_embeddings:
        matrix("output.weight", "lm_head.weight", np_("lm_head.weight"))
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        vector(b + "attn_norm.weight", p + "input_layernorm.weight")
        vector(b + "ffn_norm.weight", p + "post_attention_layernorm.weight")
        for x, n in (("q", heads), ("k", kv_heads), ("v", 0)):
            data = np_(p + f"self_attn.{x}_proj.weight")
            matrix(b + f"attn_{x}.weight", (p + f"self_attn.{x}_proj.weight", n if arch == "llama" else 0),
                   _permute(data, n) if arch == "llama" and n else data)
            if p + f"self_attn.{x}_proj.bias" in state:
                bias = np_(p + f"self_attn.{x}_proj.bias")
                w.add_tensor(b + f"attn_{x}.bias", _permute(bias, n) if arch == "llama" and n else bias)
        matrix(b + "attn_output.weight", p + "self_attn.o_proj.weight", np_(p + "self_attn.o_proj.weight"))
        if p + "self_attn.q_norm.weight" in state:
            vector(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight")
            vector(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight")
        matrix(b + "ffn_gate_inp.weight", p + "mlp.gate.weight", np_(p + "mlp.gate.weight"))
        gate_up = np_(p + "mlp.experts.gate_up_proj")  # [E, 2I, H], each expert's gate rows first
        matrix(b + "ffn_gate_exps.weight", (p + "mlp.experts.gate_up_proj", "gate"), gate_up[:, :inter])
        matrix(b + "ffn_up_exps.weight", (p + "mlp.experts.gate_up_proj", "up"), gate_up[:, inter:])
        matrix(b + "ffn_down_exps.weight", p + "mlp.experts.down_proj", np_(p + "mlp.experts.down_proj"))
        if p + "mlp.shared_expert_gate.weight" in state:
            vector(b + "ffn_gate_inp_shexp.weight", p + "mlp.shared_expert_gate.weight")
            for x in ("gate", "up", "down"):
                name = p + f"mlp.shared_expert.{x}_proj.weight"
                matrix(b + f"ffn_{x}_shexp.weight", name, np_(name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with torch.no_grad():  # state_dict's tensors share the model's storage
        for hf_names, values in dequantized.values():
            if isinstance(hf_names, str):
                state[hf_names].copy_(torch.from_numpy(np.ascontiguousarray(values)))
                continue
            name, what = hf_names
            if what in ("gate", "up"):
                half = state[name].shape[1] // 2
                target = state[name][:, :half] if what == "gate" else state[name][:, half:]
            else:  # Q or K permuted for llama.cpp (what: its head count), or not permuted (0)
                target = state[name]
                values = _permute_back(values, what) if what else values
            target.copy_(torch.from_numpy(np.ascontiguousarray(values)))
    return path


def _permute_back(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of _permute."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
