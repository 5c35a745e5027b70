"""llama.cpp's GGUF LoRA adapters, written by llama.cpp's own converter (convert_lora_to_gguf.py of the pinned
llama.cpp, which scripts/setup.sh unpacks into .deps/) from peft adapters: on a GGUF base kept as stored (the llama
architecture, whose Q and K rows the converter permutes in the base and in B) and on a Qwen2 safetensors base.
Checked against transformers + peft on the same weights (greedy tokens identical, logprobs close), and bit for bit
against the same adapter read from its PEFT directory; a GGUF adapter, a PEFT adapter and the base in one batch on the
quantized base, each row the same bits as its run alone; every bad GGUF adapter refused by name."""

import json

import numpy as np
import pytest
import torch

from rtp_llm import LLM, SamplingParams
from rtp_llm.errors import RequestRejected
from rtp_llm.lora import LoRARequest
from rtp_llm.models.default_model import default_model_path
from tests.engine.lora_helpers import convert, make_adapter, reference
from tests.models.tiny_checkpoints import make_checkpoint
from tests.models.tiny_gguf import write_tiny_gguf

PROMPTS = [[5, 17, 33, 2, 90, 14, 7], [100, 3, 3, 41, 8, 250, 61, 19, 4, 77, 12]]
GREEDY = SamplingParams(max_tokens=8, temperature=0, logprobs=0)


def run(llm, prompts, lora):
    outs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=lora)
    return [(o.outputs[0].token_ids, [x.logprob for x in o.outputs[0].logprobs]) for o in outs]


def gguf_base(tmp_path):
    """A tiny llama GGUF in Q8_0, transformers' model of it (the dequantized weights) and a config directory for the
    converter (transformers' GGUF config has no `architectures`)."""
    from transformers import AutoModelForCausalLM

    path = write_tiny_gguf(str(tmp_path / "base.gguf"), "Q8_0", seed=3)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="base.gguf", dtype=torch.float32).eval()
    cfg = hf.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    return path, hf, tmp_path / "hf"


def gguf_engine(path, **kw):
    llm = LLM(path, enable_lora=True, quantization="auto", block_size=4, num_blocks=256, max_model_len=256, **kw)
    qkv = llm.core.runner.model.layers[0].part("qkv")
    assert qkv.quantized is not None and qkv.weight.numel() == 0  # the base runs as stored
    return llm


@pytest.mark.parametrize("outtype", ["f32", "bf16"])
def test_gguf_adapters_on_a_gguf_base_match_peft(tmp_path, outtype):
    path, hf, cfg_dir = gguf_base(tmp_path)
    ref = make_adapter(hf, tmp_path / "peft", 8, bf16_values=True)
    g = LoRARequest("g", 1, convert(tmp_path / "peft", cfg_dir, tmp_path / "a.gguf", outtype))
    p = LoRARequest("p", 2, str(tmp_path / "peft"))
    llm = gguf_engine(path, max_loras=2)
    from_gguf, from_peft = run(llm, PROMPTS, g), run(llm, PROMPTS, p)
    assert from_gguf == from_peft  # the same numbers, Q and K's B un-permuted: the same bits
    for prompt, (tokens, lps) in zip(PROMPTS, from_gguf):
        want, want_lps = reference(ref, prompt, 8)
        assert tokens == want
        assert max(abs(a - b) for a, b in zip(lps, want_lps)) < 1e-3  # the quantized kernels' rounding
    base = run(llm, [PROMPTS[1]], None)[0]
    with ref.disable_adapter():
        assert base[0] == reference(ref, PROMPTS[1], 8)[0]
    assert base[0] != from_gguf[1][0]  # the adapter changes the answer
    # the GGUF adapter, the PEFT adapter and the base in one batch: each row its run alone, bit for bit
    assert run(llm, [PROMPTS[1]] * 3, [g, p, None]) == [from_gguf[1], from_peft[1], base]


def test_a_gguf_adapter_on_a_qwen2_safetensors_base(tmp_path):
    """No permutation for qwen2 (an un-permuted B would give other bits than the PEFT directory); a subset of the
    modules; alpha / r as llama.cpp scales it."""
    hf = make_checkpoint(tmp_path / "base", "qwen2_gqa4_bias_untied")
    ref = make_adapter(hf, tmp_path / "peft", 4, ["q_proj", "k_proj", "down_proj"], seed=1, bf16_values=True)
    g = LoRARequest("g", 1, convert(tmp_path / "peft", tmp_path / "base", tmp_path / "a.gguf"))
    llm = LLM(str(tmp_path / "base"), tokenizer=default_model_path(), enable_lora=True, block_size=4,
              num_blocks=256, max_model_len=256)
    from_gguf = run(llm, PROMPTS, g)
    assert from_gguf == run(llm, PROMPTS, LoRARequest("p", 2, str(tmp_path / "peft")))
    for prompt, (tokens, lps) in zip(PROMPTS, from_gguf):
        want, want_lps = reference(ref, prompt, 8)
        assert tokens == want
        assert max(abs(a - b) for a, b in zip(lps, want_lps)) < 1e-4


def rewrite(src, dst, arch=None, drop=(), tensors=None, fields=None) -> str:
    """A copy of a GGUF adapter with tensors dropped, replaced or added and fields added or changed."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch or r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture" and key not in (fields or {}):
            w.add_key_value(key, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    for key, (value, vtype, sub) in (fields or {}).items():
        w.add_key_value(key, value, vtype, sub)
    extra = dict(tensors or {})
    for t in r.tensors:
        if t.name not in drop:
            data = extra.pop(t.name, None)
            w.add_tensor(t.name, np.array(t.data) if data is None else data)
    for name, data in extra.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(dst)


def test_bad_gguf_adapters_are_refused_by_name_and_the_base_keeps_serving(tmp_path):
    import gguf

    path, hf, cfg_dir = gguf_base(tmp_path)
    make_adapter(hf, tmp_path / "peft", 8, bf16_values=True)
    good = convert(tmp_path / "peft", cfg_dir, tmp_path / "a.gguf")
    arr = np.ones((8, 64), dtype=np.float32)
    t = gguf.GGUFValueType
    cases = [
        (path, "general.type None, not 'adapter'"),  # the base model itself
        (rewrite(good, tmp_path / "arch.gguf", arch="qwen2"), "for a 'qwen2' model; this base is 'llama'"),
        (rewrite(good, tmp_path / "embd.gguf", tensors={"token_embd.weight.lora_a": arr,
                                                        "token_embd.weight.lora_b": arr}),
         "tensor token_embd.weight.lora_a is not supported"),
        (rewrite(good, tmp_path / "norm.gguf", tensors={"blk.0.attn_norm.weight": arr[0]}),
         "tensor blk.0.attn_norm.weight is not supported"),
        (rewrite(good, tmp_path / "alora.gguf", fields={"adapter.alora.invocation_tokens": ([5, 6], t.ARRAY,
                                                                                           t.UINT32)}),
         "activated LoRA"),
        (rewrite(good, tmp_path / "type.gguf", fields={"adapter.type": ("control_vector", t.STRING, None)}),
         "adapter.type 'control_vector' is not 'lora'"),
        (rewrite(good, tmp_path / "pair.gguf", drop=("blk.1.ffn_up.weight.lora_b",)), "layer 1 up_proj has lora_A without its pair"),
        (rewrite(good, tmp_path / "shape.gguf", tensors={"blk.0.attn_q.weight.lora_a": np.ones((8, 96), np.float32)}),
         r"q_proj has A \(8, 96\)"),
        (str(tmp_path / "missing.gguf"), "no file"),
    ]
    llm = gguf_engine(path, max_lora_rank=8)
    for i, (adapter, words) in enumerate(cases, start=1):
        with pytest.raises(RequestRejected, match=words):
            run(llm, [PROMPTS[0]], LoRARequest(f"bad{i}", i, adapter))
    small = gguf_engine(path, max_lora_rank=4)
    with pytest.raises(RequestRejected, match="rank 8, which exceeds --max_lora_rank 4"):
        run(small, [PROMPTS[0]], LoRARequest("big", 1, good))
    assert run(llm, [PROMPTS[0]], LoRARequest("good", 99, good))[0][0]  # the good one still loads
    assert run(llm, [PROMPTS[0]], None)[0][0]  # and the base serves
    assert not llm.core.requests and llm.core.scheduler.manager.stats().used_blocks == 0
