"""Tiny llama-architecture GGUF files written with the `gguf` package, every matrix in one block format, with
the embedded default model's tokenizer (so that transformers can load the same file as a reference). The
32-element formats go through gguf's quantizer; the k-quants (which it cannot write) are random blocks whose
fp16 scales are set so that the weights have the size of the others'."""

from __future__ import annotations

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


def write_tiny_gguf(path: str, fmt: str, seed: int = 0, head_dim_64: bool = False, with_vocab: bool = True,
                    overrides: dict[str, str] | None = None) -> str:
    """overrides: a 32-element format for some of each layer's matrices by GGUF name ({"attn_v": "Q8_0"}, as
    llama.cpp's k-quant mixes write them)."""
    import gguf

    from rtp_llm.models.default_model import default_model_path

    src = gguf.GGUFReader(default_model_path())
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    w = gguf.GGUFWriter(path, "llama")
    for key, field in src.fields.items():  # the tokenizer and its chat template, as stored
        if key.startswith("tokenizer.") and (with_vocab or key not in VOCAB_FIELDS):
            types = field.types
            w.add_key_value(key, field.contents(), types[0], types[-1] if len(types) > 1 else None)
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
