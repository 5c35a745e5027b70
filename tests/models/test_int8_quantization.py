"""--quantization int8: every linear layer (and an untied LM head) of any checkpoint as per-output-channel symmetric
int8 made at load (QuantizedWeight.per_channel_int8, Q8_0 blocks sharing their row's scale), run by the same quantized
kernels as GGUF. The reference is transformers with each of those weights replaced by its int8 value (q * scale, as
gguf dequantizes the blocks): greedy tokens identical, logits within 1e-3, through the engine with chunked prefill
and the prefix cache; the weights take ~1/4 of their float32 bytes."""

import pytest
import torch

from rtp_llm import LLM
from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.models.default_model import default_model_path
from rtp_llm.models.registry import load_model
from rtp_llm.sampling import SamplingParams
from tests.models.bf16_rule import assert_transformers_agree
from tests.models.int8_reference import to_int8_values
from tests.models.static_generate import StaticRunner
from tests.models.tiny_checkpoints import make_checkpoint

PROMPTS = [[1, 50, 34, 200, 7, 9, 33], [1, 9, 8, 7, 6, 5, 4, 3, 200, 31, 27, 40, 5]]
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("int8")
    hf = to_int8_values(make_checkpoint(path, "qwen2_gqa4_bias_untied"))  # q/k/v biases, untied head
    hf.generation_config.eos_token_id = None
    return str(path), hf


def hf_reference(hf, prompt, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), [x[0] for x in out.logits]


def test_int8_model_matches_transformers_on_the_int8_values(ckpt, caplog):
    path, hf = ckpt
    with caplog.at_level("INFO"):
        model, cfg = load_model(path, ops=CpuOps(), quantization="int8")
    linears = [lin for layer in model.layers for lin in layer.linears()] + [model.head]
    assert all(lin.quantized is not None and lin.quantized.format == "Q8_0" for lin in linears)
    assert all(lin.weight.numel() == 0 and lin.kernel.packed.dtype == torch.uint8 for lin in linears)
    assert model.embed_quantized is None and model.embed.numel() > 0      # the embedding stays float
    floats = sum(lin.quantized.shape[0] * lin.quantized.shape[1] for lin in linears)
    assert sum(lin.quantized.nbytes for lin in linears) == floats * 34 // 32   # int8 + a fp16 scale per 32
    assert any("attention Q8_0, mlp Q8_0" in r.getMessage() for r in caplog.records)
    ours = StaticRunner(model, cfg, num_blocks=32, block_size=16).generate(
        PROMPTS, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), keep_logits=True)
    for prompt, out in zip(PROMPTS, ours):
        tokens, logits = hf_reference(hf, prompt, 12)
        assert out.token_ids == tokens
        for mine, theirs in zip(out.logits, logits):
            assert (mine - theirs).abs().max().item() < 1e-3


def test_int8_through_the_engine_with_chunks_and_prefix_cache(ckpt):
    path, hf = ckpt
    prompt = list(range(100, 160))
    tokens, _ = hf_reference(hf, prompt, 8)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with LLM(path, tokenizer=default_model_path(), quantization="int8", max_num_batched_tokens=16, block_size=16, num_blocks=64,
             max_model_len=256) as llm:
        assert llm.core.runner.model.layers[0].mlp.down.quantized.format == "Q8_0"
        first = llm.generate([prompt], params, use_tqdm=False)[0]
        again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == tokens
    assert again.num_cached_tokens >= 48


def test_int8_of_a_bfloat16_model_runs_on_the_quantized_kernels(ckpt):
    """--dtype bfloat16 --quantization int8: the int8 form is made from the bf16 weights and the bf16 activations
    meet it on the same kernels; against transformers in bf16 with each weight replaced by the int8 value made from
    its own bf16 weight (the bf16 rule: its weights carry one rounding, ours none)."""
    from transformers import AutoModelForCausalLM

    path, _ = ckpt
    model, cfg = load_model(path, ops=CpuOps(), dtype="bfloat16", quantization="int8")
    linears = [lin for layer in model.layers for lin in layer.linears()] + [model.head]
    assert all(lin.quantized is not None and lin.quantized.format == "Q8_0" and lin.weight.numel() == 0
               for lin in linears)
    hf = to_int8_values(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval())
    strict = 0
    for prompt in PROMPTS:
        out = StaticRunner(model, cfg, num_blocks=32, block_size=16).generate(
            [prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
        strict += assert_transformers_agree(hf, prompt, out.token_ids)
    assert strict >= 12, strict  # most steps had a clear winner, which the rule then required
