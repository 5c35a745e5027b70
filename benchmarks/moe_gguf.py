"""The Qwen3-30B-A3B-shaped model of benchmarks/moe_decode.py as a Q4_K_M GGUF, for llama.cpp and rtp_llm on the same
file: written in F16 with llama.cpp's gguf-py (random weights, one seed per tensor; the tokenizer fields of
Qwen2.5-Coder's GGUF, the same 151,936-token vocabulary as Qwen3's), then quantized by the peer build's
llama-quantize (its Q4_K_M mix: Q6_K for the head and some attn_v / ffn_down, Q4_K elsewhere). The F16 file is
deleted after. Benchmark-only, never in CI: needs `bash benchmarks/peers/setup_llamacpp.sh` and `bash
benchmarks/peers/setup_qwen_coder.sh`.

    python -m benchmarks.moe_gguf [--layers 12]      # prints the Q4_K_M file's path
"""

from __future__ import annotations

import argparse
import os
import subprocess

import numpy as np
import torch

from benchmarks.moe_decode import SHAPE

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUANTIZE = os.path.join(_ROOT, ".venv-llamacpp", "build", "bin", "llama-quantize")
TOKENIZER_GGUF = os.path.expanduser("~/.cache/rtp_llm/bench/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


def _tensors(layers: int):
    """(GGUF name, numpy shape, std, kept in F32) in file order; std None: a norm's ones. The router and the norms
    stay F32 as llama.cpp's converter keeps them; the matrices are F16 for llama-quantize."""
    h, e, inter = SHAPE["hidden_size"], SHAPE["num_experts"], SHAPE["moe_intermediate_size"]
    q, kv, vocab = SHAPE["num_attention_heads"] * 128, SHAPE["num_key_value_heads"] * 128, SHAPE["vocab_size"]
    yield "token_embd.weight", (vocab, h), 0.02, False
    yield "output_norm.weight", (h,), None, True
    yield "output.weight", (vocab, h), 0.02, False
    for i in range(layers):
        b = f"blk.{i}."
        yield from ((b + "attn_norm.weight", (h,), None, True), (b + "ffn_norm.weight", (h,), None, True),
                    (b + "attn_q.weight", (q, h), 0.02, False), (b + "attn_k.weight", (kv, h), 0.02, False),
                    (b + "attn_v.weight", (kv, h), 0.02, False), (b + "attn_output.weight", (h, q), 0.02, False),
                    (b + "attn_q_norm.weight", (128,), None, True), (b + "attn_k_norm.weight", (128,), None, True),
                    # routers that spread the tokens over the experts
                    (b + "ffn_gate_inp.weight", (e, h), 0.5, True),
                    (b + "ffn_gate_exps.weight", (e, inter, h), 0.02, False),
                    (b + "ffn_up_exps.weight", (e, inter, h), 0.02, False),
                    (b + "ffn_down_exps.weight", (e, h, inter), 0.02, False))


def _data(index: int, shape, std, f32: bool) -> np.ndarray:
    if std is None:
        return np.ones(shape, dtype=np.float32)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(index)) * std
    return x.numpy() if f32 else x.half().numpy()


def write_f16(path: str, layers: int) -> None:
    import gguf

    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_block_count(layers)
    w.add_context_length(SHAPE["max_position_embeddings"])
    w.add_embedding_length(SHAPE["hidden_size"])
    w.add_feed_forward_length(SHAPE["intermediate_size"])
    w.add_expert_feed_forward_length(SHAPE["moe_intermediate_size"])
    w.add_expert_count(SHAPE["num_experts"])
    w.add_expert_used_count(SHAPE["num_experts_per_tok"])
    w.add_head_count(SHAPE["num_attention_heads"])
    w.add_head_count_kv(SHAPE["num_key_value_heads"])
    w.add_key_length(128)
    w.add_value_length(128)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(SHAPE["rms_norm_eps"])
    src = gguf.GGUFReader(TOKENIZER_GGUF)
    for key, field in src.fields.items():
        if key.startswith("tokenizer."):
            types = list(field.types)
            if types[0] == gguf.GGUFValueType.ARRAY:
                w.add_key_value(key, field.contents(), types[0], sub_type=types[-1])
            else:
                w.add_key_value(key, field.contents(), types[0])
    specs = list(_tensors(layers))
    for name, shape, _, f32 in specs:
        w.add_tensor_info(name, shape, np.dtype(np.float32 if f32 else np.float16),
                          int(np.prod(shape)) * (4 if f32 else 2))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (_, shape, std, f32) in enumerate(specs):
        w.write_tensor_data(_data(i, shape, std, f32))
    w.close()


def q4_k_m_path(layers: int) -> str:
    out = os.path.expanduser(f"~/.cache/rtp_llm/bench/qwen3-moe-a3b-shape-l{layers}-q4_k_m.gguf")
    if os.path.exists(out):
        return out
    for need in (QUANTIZE, TOKENIZER_GGUF):
        if not os.path.exists(need):
            raise SystemExit(f"{need} missing: bash benchmarks/peers/setup_llamacpp.sh and setup_qwen_coder.sh")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    f16 = out.replace("-q4_k_m.gguf", "-f16.gguf")
    write_f16(f16, layers)
    try:
        subprocess.run([QUANTIZE, f16, out + ".part", "Q4_K_M", "2"], check=True, stdout=subprocess.DEVNULL)
        os.replace(out + ".part", out)
    finally:
        os.remove(f16)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    print(q4_k_m_path(ap.parse_args().layers))
