"""GGUF weights kept as stored (--quantization auto) on the CPU: a tiny llama written in each block format, and
the embedded default model (Q4_1 + Q8_0), against transformers loading the same file (its weights are gguf's
dequantized values): the same greedy tokens, logits within 1e-3, and (AVX-512) the same logits bit for bit as the
file dequantized; through the engine with chunked prefill and prefix caching; and the resident memory the weights
take after load."""

import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from rtp_llm import LLM
from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.models.default_model import default_model_path
from rtp_llm.models.registry import load_model
from rtp_llm.sampling import SamplingParams
from tests.models.bf16_rule import assert_engines_agree, assert_transformers_agree, margin_of, reference_logits
from tests.models.static_generate import StaticRunner, assert_blocks_match_reference
from tests.models.tiny_gguf import write_tiny_gguf

FORMATS = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
PROMPTS = [[1, 504, 3458, 6353, 28, 17], [1, 9, 8, 7, 6, 5, 4, 3, 2000, 31000, 27, 40000, 5]]


@functools.lru_cache(maxsize=2)
def hf_model(path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    return hf


def hf_reference(path, prompt, n):
    hf = hf_model(path)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=2)
    return out.sequences[0, len(prompt):].tolist(), [x[0] for x in out.logits]


def assert_runs_as_stored(model, fmt_linears, fmt_embedding):
    for layer in model.layers:
        for lin in layer.linears():
            assert lin.quantized is not None and lin.quantized.format == fmt_linears
            assert lin.weight.numel() == 0  # no float copy beside the blocks
            assert lin.kernel.packed.dtype == torch.uint8
        # float32 runs: gate_up's blocks in gated panels' order, the SiLU in the kernel (quant_linear_silu)
        assert layer.mlp.gate_up.kernel.gated == (layer.mlp.gate_up.weight.dtype == torch.float32)
    assert model.embed_quantized is not None and model.embed_quantized.format == fmt_embedding
    assert model.embed.numel() == 0


@pytest.fixture(scope="module", params=FORMATS)
def tiny(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param) / f"tiny_{request.param}.gguf")
    return request.param, write_tiny_gguf(path, request.param, seed=FORMATS.index(request.param))


def test_tiny_model_matches_transformers_on_the_same_file(tiny):
    fmt, path = tiny
    model, cfg = load_model(path, ops=CpuOps(gguf_blocks="on"), quantization="auto")
    assert_runs_as_stored(model, fmt, fmt)
    dense, _ = load_model(path, ops=CpuOps(gguf_blocks="on"), quantization="none")
    assert all(lin.quantized is None for layer in dense.layers for lin in layer.linears())
    assert_blocks_match_reference(model, dense, cfg, PROMPTS, lambda prompt, n: hf_reference(path, prompt, n), 12)


def test_a_qkv_mixing_q5_0_and_q8_0_stays_quantized_as_q8_0(tmp_path):
    """llama.cpp's Q4_K_M files write some layers' v_proj in Q8_0 beside Q5_0 q and k (Qwen2.5's): the fused qkv
    keeps all three as Q8_0 blocks with the same values (QuantizedWeight.as_q8_0), not a float copy; greedy tokens
    and logits as transformers on the same file, and the dequantized model's bits."""
    path = write_tiny_gguf(str(tmp_path / "tiny_mix.gguf"), "Q5_0", seed=5, overrides={"attn_v": "Q8_0"})
    model, cfg = load_model(path, ops=CpuOps(gguf_blocks="on"), quantization="auto")
    for layer in model.layers:
        assert layer.qkv.quantized is not None and layer.qkv.quantized.format == "Q8_0"
        assert layer.qkv.weight.numel() == 0 and layer.o.quantized.format == "Q5_0"
    dense, _ = load_model(path, ops=CpuOps(gguf_blocks="on"), quantization="none")
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    ours = StaticRunner(model, cfg, num_blocks=32, block_size=16).generate(PROMPTS, params, keep_logits=True)
    plain = StaticRunner(dense, cfg, num_blocks=32, block_size=16).generate(PROMPTS, params, keep_logits=True)
    for prompt, out, out_dense in zip(PROMPTS, ours, plain):
        tokens, logits = hf_reference(path, prompt, 8)
        assert out.token_ids == tokens
        assert max((a - b).abs().max().item() for a, b in zip(out.logits, logits)) < 1e-3
        if model.ops.kernels.cpu_isa() == "avx512":
            assert all(torch.equal(a, b) for a, b in zip(out.logits, out_dense.logits))


def test_engine_with_chunked_prefill_and_prefix_cache(tiny):
    fmt, path = tiny
    prompt = list(range(100, 160))  # 60 tokens: four 16-token chunks
    tokens, _ = hf_reference(path, prompt, 8)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with LLM(path, max_num_batched_tokens=16, block_size=16, num_blocks=64, max_model_len=512,
             enable_prefix_caching=True, device_options={"cpu_gguf_blocks": "on"}) as llm:
        model = llm.core.runner.model
        assert model.layers[0].qkv.quantized.format == fmt
        # greedy steps screen the packed head (quant_greedy_head) where the CPU has avx512_bf16
        assert (model.head.kernel.screen is not None) == model.ops.kernels.cpu_avx512_bf16()
        first = llm.generate([prompt], params, use_tqdm=False)[0]
        again = llm.generate([prompt], params, use_tqdm=False)[0]  # its prefix now comes from the cache
        assert first.outputs[0].token_ids == again.outputs[0].token_ids == tokens
        assert again.num_cached_tokens >= 48


def test_greedy_batches_screen_the_packed_head(tiny):
    """Six greedy sequences in one step: the head of blocks finds their tokens through quant_greedy_head's screen
    (where the CPU has avx512_bf16), the tokens transformers gives on the same file."""
    fmt, path = tiny
    prompts = [[3 + i, 17, 5 + 2 * i, 9, 11 + i] for i in range(6)]
    expected = [hf_reference(path, p, 6)[0] for p in prompts]
    with LLM(path, block_size=16, num_blocks=64, max_model_len=256) as llm:
        ops = llm.core.runner.model.ops
        kernels, calls = ops.kernels, []

        class Counting:  # the screen's op, counted; every other op passes through
            def __getattr__(self, name):
                if name == "quant_greedy_head":
                    return lambda *a: calls.append(a[0].shape[0]) or kernels.quant_greedy_head(*a)
                return getattr(kernels, name)

        ops.kernels = Counting()
        outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), use_tqdm=False)
        ops.kernels = kernels
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert bool(calls) == kernels.cpu_avx512_bf16() and all(rows >= ops.QUANT_SCREEN_MIN_ROWS for rows in calls)


@pytest.fixture(scope="module", params=FORMATS)
def tiny_no_vocab(request, tmp_path_factory):
    # without the 49,152-token vocabulary (the tokenizer comes from the default model): each parse of the file is
    # then milliseconds, not seconds
    path = str(tmp_path_factory.mktemp(request.param) / f"tiny_nv_{request.param}.gguf")
    return request.param, write_tiny_gguf(path, request.param, seed=FORMATS.index(request.param), with_vocab=False)


def test_bf16_keeps_the_blocks_and_follows_the_bf16_rule(tiny_no_vocab):
    """--dtype bfloat16 on a GGUF: the blocks stay as stored (bf16 activations widened to the float32 kernels, each
    result rounded once) and the embedding rows are rounded to bf16 as a dense bf16 copy holds them. Through the
    engine (16-token prefill chunks, then the prefix from the cache): teacher-forced against transformers loading the
    same file in bf16 (the bf16 rule), and against the dequantized bf16 engine up to a near tie."""
    from transformers import AutoModelForCausalLM

    fmt, path = tiny_no_vocab
    model, _ = load_model(path, ops=CpuOps(gguf_blocks="on"), dtype="bfloat16", quantization="auto")
    assert_runs_as_stored(model, fmt, fmt)
    ids = torch.tensor([3, 500, 40000])
    dense_rows = model.embed_quantized.dequantize().index_select(0, ids).bfloat16()
    assert model.embed_rows(ids).dtype == torch.bfloat16 and torch.equal(model.embed_rows(ids), dense_rows)
    prompt = list(range(100, 160))
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=2)
    outs = {}
    for q in ("auto", "none"):
        with LLM(path, tokenizer=default_model_path(), dtype="bfloat16", quantization=q, max_num_batched_tokens=16,
                 block_size=16, num_blocks=64, max_model_len=512, enable_prefix_caching=True,
                 device_options={"cpu_gguf_blocks": "on"}) as llm:
            assert (llm.core.runner.model.layers[0].qkv.quantized is not None) == (q == "auto")
            first = llm.generate([prompt], params, use_tqdm=False)[0]
            again = llm.generate([prompt], params, use_tqdm=False)[0]
        assert first.outputs[0].token_ids == again.outputs[0].token_ids and again.num_cached_tokens >= 48
        outs[q] = first.outputs[0]
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.bfloat16).eval()
    tokens = outs["auto"].token_ids
    strict = assert_transformers_agree(hf, prompt, tokens)
    assert strict >= len(tokens) // 2, strict  # most steps had a clear winner, which the rule then required
    # the dequantized bf16 engine holds each weight rounded once more: its tokens may part at a near tie, even the first
    assert_engines_agree(outs["auto"], outs["none"], margin_of(reference_logits(hf, prompt, tokens)))


@pytest.fixture(scope="module")
def smollm2():
    return default_model_path()


def test_smollm2_runs_q4_1_and_q8_0_as_stored_and_matches_transformers(smollm2):
    model, cfg = load_model(smollm2, ops=CpuOps(gguf_blocks="on"))
    assert_runs_as_stored(model, "Q4_1", "Q8_0")
    assert model.head.quantized is model.embed_quantized  # the tied head reads the embedding's blocks
    prompt = [1, 504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30]
    out = StaticRunner(model, cfg, num_blocks=32, block_size=16).generate(
        [prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), keep_logits=True)[0]
    tokens, logits = hf_reference(smollm2, prompt, 16)
    assert out.token_ids == tokens
    for mine, theirs in zip(out.logits, logits):
        assert (mine - theirs).abs().max().item() < 1e-3


RSS = """
import gc, json, os, sys, tempfile
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
import torch, gguf
from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.models.registry import load_model
from tests.models.tiny_gguf import write_tiny_gguf
# a tiny GGUF loaded first, so that the modules a load imports (and their memory) are not counted as weights
tiny, _ = load_model(write_tiny_gguf(os.path.join(tempfile.mkdtemp(), "t.gguf"), "Q4_1", with_vocab=False),
                     ops=CpuOps(gguf_blocks="on"), quantization=sys.argv[2])
del tiny
gc.collect()
before = rss()
model, cfg = load_model(sys.argv[1], ops=CpuOps(gguf_blocks="on"), quantization=sys.argv[2])
gc.collect()
print(json.dumps({"delta": rss() - before}))
"""


def test_resident_memory_after_load_is_within_1_5x_the_file(smollm2):
    # a fresh process, so that only this load's pages count (no KV cache is allocated by load_model)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, "-c", RSS, smollm2, "auto"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    delta = json.loads(res.stdout.strip().splitlines()[-1])["delta"]
    size = os.path.getsize(smollm2)
    assert delta <= 1.5 * size, f"load added {delta / 1e6:.0f} MB of resident memory for a {size / 1e6:.0f} MB file"


def test_the_quantization_setting_takes_auto_none_or_int8_only(tiny):
    from rtp_llm.config.engine_config import EngineConfig
    from rtp_llm.config.server_args import resolve
    from rtp_llm.errors import ConfigError

    assert resolve([], {})["quantization"] == "auto"
    assert resolve([], {"QUANTIZATION": "none"})["quantization"] == "none"
    assert resolve(["--quantization", "auto"], {"QUANTIZATION": "none"})["quantization"] == "auto"
    assert resolve(["--quantization", "int8"], {})["quantization"] == "int8"
    assert EngineConfig(quantization="int8").quantization == "int8"
    with pytest.raises(ConfigError, match="choose one of"):
        resolve(["--quantization", "int4"], {})
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="fp8")
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8"):
        load_model(tiny[1], ops=CpuOps(gguf_blocks="on"), quantization="int4")


def test_an_engine_load_parses_its_gguf_once_and_keeps_nothing(tmp_path, monkeypatch):
    # the config, the memory plan, the weights and the tokenizer share one parse of the header during the load, and
    # nothing is kept after it (a kept reader would keep the file's pages mapped).
    from rtp_llm.models import gguf_reader

    path = write_tiny_gguf(str(tmp_path / "tiny_Q8_0.gguf"), "Q8_0", seed=0)
    opened = []
    parse = gguf_reader._parse

    def counting_parse(p, *args):
        opened.append(p)
        return parse(p, *args)

    monkeypatch.setattr(gguf_reader, "_parse", counting_parse)
    with LLM(path, num_blocks=16, max_model_len=64) as llm:
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 2
    assert opened == [path]
    assert getattr(gguf_reader._shared, "files", None) is None
    gguf_reader.open_gguf(path)  # outside an engine load: a fresh parse every time
    gguf_reader.open_gguf(path)
    assert len(opened) == 3


def test_gguf_blocks_are_kept_where_their_kernels_are_fast_unless_told(tiny):
    """quantization auto keeps the blocks where a block kernel runs (AVX-512 or AVX2) and dequantizes them at load
    elsewhere; cpu_gguf_blocks on / off decides it either way, for the same greedy tokens."""
    fmt, path = tiny
    fast = CpuOps(gguf_blocks="on").kernels.cpu_isa() in ("avx512", "avx2")
    tokens = {}
    for blocks in ("auto", "on", "off"):
        model, cfg = load_model(path, ops=CpuOps(gguf_blocks=blocks), quantization="auto")
        kept = {lin.quantized is not None for layer in model.layers for lin in layer.linears()}
        assert kept == {blocks == "on" or (blocks == "auto" and fast)}, blocks
        out = StaticRunner(model, cfg, num_blocks=32, block_size=16).generate(
            PROMPTS[:1], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
        tokens[blocks] = out.token_ids
    assert tokens["auto"] == tokens["on"] == tokens["off"]
    with pytest.raises(ValueError, match="cpu_gguf_blocks must be one of"):
        CpuOps(gguf_blocks="maybe")
