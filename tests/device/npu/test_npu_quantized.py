"""GGUF weights kept quantized on the (emulated) NPU: each linear layer on npu_weight_quant_batchmatmul over int4 /
int8 integers with bf16 group scales and offsets (rtp_llm/device/npu/quant_linear.py), the tied head and embedding on
the same int8 tensors. Tiny llama GGUFs in every block format, through the whole engine (chunked prefill, prefix
cache): greedy tokens against transformers loading the same file in bf16 (teacher-forced, the bf16 rule of
test_npu_engine.py) and against the NPU engine on the dequantized weights. Q6_K (16-element sub-blocks, below the
op's smallest group) runs dense, and says so."""

import os

import pytest
import torch

from tests.npu_emulator.install import install

torch_npu = install()

from rtp_llm.device.npu.quant_linear import NpuQuantLinear  # noqa: E402
from tests.device.npu.helpers import (  # noqa: E402,F401  (tok: a fixture)
    MAX_TOKENS, PROMPTS, assert_engines_agree, assert_transformers_agree, engine, margin_of, reference_logits,
    staggered, tok)
from tests.models.tiny_gguf import write_tiny_gguf  # noqa: E402

# The bf16 rule's margin covers one rounding per weight (a dense bf16 copy); a weight here carries two, its group's
# scale (and offset) rounded to bf16 and then the product (tests/models/test_int_groups.py bounds it): twice the reach.
QUANT_ROUNDINGS = 2
FORMATS = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
INT4 = ("Q4_0", "Q4_1", "Q4_K")


@pytest.fixture(scope="module", params=FORMATS)
def tiny(request, tmp_path_factory):
    fmt = request.param
    path = tmp_path_factory.mktemp(fmt) / f"tiny_{fmt}.gguf"
    return fmt, write_tiny_gguf(str(path), fmt, seed=10 + FORMATS.index(fmt), head_dim_64=True, with_vocab=False)


def hf_bf16(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=torch.bfloat16).eval()


def test_npu_engine_runs_each_format_quantized(tiny, tok, caplog):
    fmt, path = tiny
    with caplog.at_level("INFO"):
        quant = engine(path, tok, "npu", max_prefill_chunk=37)
    model = quant.runner.model
    linears = [lin for layer in model.layers for lin in layer.linears()] + [model.head]
    if fmt == "Q6_K":
        assert not any(isinstance(lin.kernel, NpuQuantLinear) for lin in linears)
    else:
        assert all(isinstance(lin.kernel, NpuQuantLinear) for lin in linears)
        assert all(lin.weight.numel() == 0 for lin in linears)                   # no dense copy on the device
        for lin in linears[:-1]:
            assert lin.kernel.int4 == (fmt in INT4)
            dense_bytes = 2 * lin.kernel.out_features * lin.kernel.in_features  # the bf16 weight it replaces
            assert lin.kernel.nbytes <= dense_bytes * (0.32 if fmt in INT4 else 0.57)
        assert model.head.kernel is not None and not model.head.kernel.int4     # tied: int8, shared with lookups
        assert any("kept quantized for npu_weight_quant_batchmatmul" in r.getMessage() for r in caplog.records)
    dense = engine(path, tok, "npu", quantization="none")
    assert not any(isinstance(lin.kernel, NpuQuantLinear) for layer in dense.runner.model.layers
                   for lin in layer.linears())
    on_quant, on_dense = staggered(quant), staggered(dense)
    hf = hf_bf16(path)
    strict = compared = 0
    for i, prompt in enumerate(PROMPTS):
        ours = on_quant[f"r{i}"].outputs[0]
        strict += assert_transformers_agree(hf, prompt, ours.token_ids, QUANT_ROUNDINGS)
        margin = QUANT_ROUNDINGS * margin_of(reference_logits(hf, prompt, ours.token_ids))
        compared += assert_engines_agree(ours, on_dense[f"r{i}"].outputs[0], margin)
    total = sum(MAX_TOKENS)
    # Each divergence between the engines is checked to be a near tie above; how early the first one comes depends
    # on the host's bf16 rounding (torch's AMX matmuls on a Xeon: 27 of 56 tokens before it), so the floor that
    # keeps the comparison from being vacuous is a third of the tokens.
    assert strict >= total // 2 and compared >= total // 3, (strict, compared, total)
    assert on_quant["r2"].num_cached_tokens == 128       # a prefix-cache hit on the quantized path
    assert quant.stats()["kv_used_blocks"] == 0


def test_int8_of_a_safetensors_checkpoint_on_the_npu(tmp_path, tok):
    """--quantization int8 on the NPU: a bf16 safetensors model's linear layers as per-channel int8 on the same op,
    against transformers on the int8 values in bf16 (the bf16 rule, two roundings per weight)."""
    from tests.models.int8_reference import to_int8_values
    from tests.models.tiny_checkpoints import make_checkpoint

    hf = make_checkpoint(tmp_path, "qwen3_hd64")
    eng = engine(tmp_path, tok, "npu", quantization="int8")
    model = eng.runner.model
    assert all(isinstance(lin.kernel, NpuQuantLinear) and not lin.kernel.int4 and lin.quantized.format == "Q8_0"
               for layer in model.layers for lin in layer.linears())
    assert isinstance(model.head.kernel, NpuQuantLinear)  # untied: the head is int8 too
    hf = to_int8_values(hf).to(torch.bfloat16)
    out = staggered(eng)
    strict = sum(assert_transformers_agree(hf, prompt, out[f"r{i}"].outputs[0].token_ids, QUANT_ROUNDINGS)
                 for i, prompt in enumerate(PROMPTS))
    assert strict >= sum(MAX_TOKENS) // 2
