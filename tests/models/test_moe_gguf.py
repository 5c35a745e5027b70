"""Mixture-of-experts GGUF files (qwen3moe, qwen2moe, and Mixtral as llama.cpp's llama with experts), every matrix in
one block format: each expert kept as its own blocks, against transformers holding the values gguf dequantizes
from the same blocks (the same greedy tokens, logits within 1e-3), and (AVX-512) bit for bit the same logits as the
file dequantized at load."""

import pytest

from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.layers.moe import SparseMoE
from rtp_llm.models.registry import load_model
from tests.models.parity import hf_greedy
from tests.models.static_generate import assert_blocks_match_reference
from tests.models.tiny_checkpoints import make_checkpoint
from tests.models.tiny_gguf import K_QUANT_SCALE, write_moe_gguf

# (checkpoint variant, format): every block format, each architecture at least twice
CASES = [("qwen3_moe_top2_e5", "Q8_0"), ("qwen3_moe_top2_e5", "Q4_1"), ("qwen3_moe_top2_e5", "Q4_K"),
         ("qwen2_moe_shared", "Q4_0"), ("qwen2_moe_shared", "Q5_K"),
         ("mixtral_top2_e5", "Q5_0"), ("mixtral_top2_e5", "Q5_1"), ("mixtral_top2_e5", "Q6_K")]
PROMPTS = [[5, 17, 42, 9, 3], [(i * 37) % 250 + 3 for i in range(21)]]
# the k-quants' 256-element blocks: rows of whole blocks
K_SIZES = dict(hidden_size=256, moe_intermediate_size=256, intermediate_size=256, shared_expert_intermediate_size=256,
               head_dim=64)


@pytest.mark.parametrize("variant,fmt", CASES)
def test_experts_kept_as_stored_match_transformers_on_the_dequantized_values(tmp_path, variant, fmt):
    sizes = dict(K_SIZES) if fmt in K_QUANT_SCALE else {}
    if variant.startswith("mixtral"):
        sizes = {k: v for k, v in sizes.items() if k in ("hidden_size", "intermediate_size")}
    elif not variant.startswith("qwen2"):
        sizes = {k: v for k, v in sizes.items() if k != "shared_expert_intermediate_size"}
    else:
        sizes = {k: v for k, v in sizes.items() if k != "head_dim"}
    if variant.startswith("qwen3"):
        sizes["norm_topk_prob"] = True  # llama.cpp's qwen3moe graph always renormalises (Qwen3-MoE releases do)
    hf = make_checkpoint(tmp_path / "hf", variant, overrides=sizes)
    path = write_moe_gguf(str(tmp_path / "moe.gguf"), hf, fmt, seed=CASES.index((variant, fmt)))
    model, cfg = load_model(path, ops=CpuOps(gguf_blocks="on"), quantization="auto")
    dense, _ = load_model(path, ops=CpuOps(gguf_blocks="on"), quantization="none")
    assert cfg.moe is not None and cfg.moe.num_experts == (hf.config.num_local_experts
                                                            if variant.startswith("mixtral")
                                                            else hf.config.num_experts)
    for layer in model.layers:
        assert isinstance(layer.mlp, SparseMoE)
        for mlp in layer.mlp.experts:
            for lin in (mlp.gate_up, mlp.down):
                assert lin.quantized is not None and lin.quantized.format == fmt and lin.weight.numel() == 0
    assert all(lin.quantized is None for layer in dense.layers for lin in layer.linears())
    # an untied embedding's blocks are copied out of the file at load, not in the first request
    assert model.embed_quantized.packed is None and not model.embed_quantized.mapped
    assert_blocks_match_reference(model, dense, cfg, PROMPTS, lambda prompt, n: hf_greedy(hf, prompt, n), 10)
