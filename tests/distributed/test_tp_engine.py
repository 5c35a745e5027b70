"""Tensor parallelism through the engine (gloo on CPU, real worker processes): TP=2 (and 3) produce the same
tokens as TP=1 and as transformers, for tiny Qwen3 / Qwen2 / Llama checkpoints covering KV-head
replication, uneven head / MLP / vocabulary splits and biases, for mixture-of-experts checkpoints (each expert's
intermediate dimension split), and for SmolLM2 through the LLM API."""

from __future__ import annotations

import pytest
import torch

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.engine.core import EngineCore
from rtp_llm.models.default_model import default_model_path
from rtp_llm.sampling import SamplingParams
from tests.engine.helpers import Driver, greedy, run_all
from tests.models.tiny_checkpoints import make_checkpoint

CASES = [
    ("qwen3_gqa2_headdim32_untied", 2),  # 2 KV heads split 1/1, q/k norms
    ("qwen3_kv1_tied", 2),               # 1 KV head replicated on both ranks, tied vocab-parallel head
    ("qwen2_6h_3kv_bias", 2),            # uneven heads 4/2 with q/k/v biases
    ("llama_9h_3kv_odd", 2),             # SmolLM2's 9/3 heads, odd MLP (97) and vocab (255), o/down biases
    ("llama_9h_3kv_odd", 3),             # three ranks
    ("qwen2_moe_shared", 2),             # every expert and the shared expert split 16/16 and 24/24
    ("qwen3_moe_top8_e9_norm_mixed", 2), # sparse and dense layers mixed, top-8 of 9 experts, tied head
]


def _workload(vocab: int):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 17, 40, 9)]
    shared = torch.randint(3, vocab, (12,), generator=g).tolist()
    arrivals = [(i, f"g{i}", p, greedy(16, logprobs=2)) for i, p in enumerate(prompts)]
    # A cached 3-block prefix (block size 4) on the second arrival, and n=2 seeded sampling (forked blocks, CoW).
    arrivals += [(0, "prefix-a", shared + [5, 6], greedy(8)), (6, "prefix-b", shared + [7, 8, 9], greedy(8)),
                 (2, "sampled", prompts[1][:6], SamplingParams(max_tokens=12, temperature=0.8, top_k=50, seed=7,
                                                               n=2, ignore_eos=True, logprobs=1)),
                 # every prompt row's logits (LOGITS_ALL in the step message), in chunks of 7
                 (1, "prompt-lp", prompts[2], greedy(4, prompt_logprobs=2))]
    return prompts, arrivals


def _run(path: str, tp: int, arrivals, **kw):
    engine = Driver(EngineCore(EngineConfig(model=path, tokenizer=default_model_path(), tp_size=tp, block_size=4,
                                            num_blocks=200, max_num_seqs=8, max_num_batched_tokens=64,
                                            max_prefill_chunk=7, max_model_len=256, **kw)))
    try:
        procs = dict(engine.tp_runtime.procs) if engine.tp_runtime else {}
        done = run_all(engine, arrivals)
        stats = engine.stats()
    finally:
        engine.close()
    # Workers leave on rank 0's stop message, cleanly.
    assert {r: p.returncode for r, p in procs.items()} == {r: 0 for r in range(1, tp)}
    return done, stats


@pytest.mark.parametrize("variant,tp", CASES)
def test_tp_matches_tp1_and_transformers(tmp_path, variant, tp):
    hf = make_checkpoint(tmp_path, variant)
    hf.generation_config.eos_token_id = None  # the engine runs with ignore_eos
    prompts, arrivals = _workload(hf.config.vocab_size)
    ref, ref_stats = _run(str(tmp_path), 1, arrivals)
    got, stats = _run(str(tmp_path), tp, arrivals)
    assert stats["prefix_hit_tokens"] == ref_stats["prefix_hit_tokens"] >= 12  # the prefix really was reused
    for rid in ref:
        for a, b in zip(ref[rid].outputs, got[rid].outputs):
            assert a.token_ids == b.token_ids, rid
            if a.logprobs:
                lp_a = torch.tensor([x.logprob for x in a.logprobs])
                lp_b = torch.tensor([x.logprob for x in b.logprobs])
                torch.testing.assert_close(lp_b, lp_a, atol=1e-4, rtol=0)
    lp_a, lp_b = ref["prompt-lp"].prompt_logprobs, got["prompt-lp"].prompt_logprobs
    assert len(lp_b) == len(prompts[2]) and lp_b[0] is None
    torch.testing.assert_close(torch.tensor([x.logprob for x in lp_b[1:]]), torch.tensor([x.logprob for x in lp_a[1:]]),
                               atol=1e-4, rtol=0)
    for i, p in enumerate(prompts):  # and the greedy ones are what transformers generates
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
        assert got[f"g{i}"].outputs[0].token_ids == out[0, len(p):].tolist()


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculation_under_tp_changes_no_output_bit(tmp_path, method):
    """N-gram drafts, or a draft model's (the checkpoint itself, whole in rank 0's process), verified by two ranks
    (every drafted row's logits, LOGITS_ALL in the step message): tokens and logprobs bit for bit those of the same
    TP=2 engine without speculation."""
    hf = make_checkpoint(tmp_path, "qwen3_gqa2_headdim32_untied")
    _, arrivals = _workload(hf.config.vocab_size)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
            "disable_by_batch_size": 16}
    if method == "draft_model":
        spec = {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3,
                "disable_by_batch_size": 16}
    plain, _ = _run(str(tmp_path), 2, arrivals)
    got, stats = _run(str(tmp_path), 2, arrivals, speculative_config=spec)
    assert stats["spec_decode_num_accepted_tokens"] > 0
    for rid in plain:
        for a, b in zip(plain[rid].outputs, got[rid].outputs):
            assert (b.token_ids, [(x.token_id, x.logprob, x.top) for x in b.logprobs or []]) == \
                (a.token_ids, [(x.token_id, x.logprob, x.top) for x in a.logprobs or []]), rid


def test_smollm2_tp2_equals_tp1_through_the_llm_api():
    from rtp_llm import LLM

    prompts = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.",
               "List three prime numbers:"]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=1)
    outs = {}
    for tp in (1, 2):
        with LLM(tp_size=tp, kv_cache_memory_gb=0.25, max_model_len=1024,
                 device_options={"cpu_gguf_blocks": "on"}) as llm:
            # the GGUF's blocks stay as stored, each rank holding whole blocks of its slice (rank 0 here)
            model = llm.core.runner.model
            layer = model.layers[0]
            assert layer.qkv.quantized.format == "Q4_1" and model.embed_quantized.format == "Q8_0"
            assert layer.mlp.down.quantized.shape == (576, 1536 // tp)  # row-parallel: columns split
            assert layer.mlp.gate_up.quantized.shape == (2 * 1536 // tp, 576)  # column-parallel: rows split
            assert model.embed_quantized.shape[0] == model.shard.vocab
            outs[tp] = llm.generate(prompts, params, use_tqdm=False)
    for a, b in zip(outs[1], outs[2]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        torch.testing.assert_close(torch.tensor([x.logprob for x in b.outputs[0].logprobs]),
                                   torch.tensor([x.logprob for x in a.outputs[0].logprobs]), atol=1e-4, rtol=0)
    assert "Paris" in outs[2][0].outputs[0].text


def test_k_quant_gguf_shards_on_whole_blocks(tmp_path):
    """A Q4_K file (256-element blocks) under TP=2: gate/up rows and down's 512 -> 2 x 256 columns split on block
    boundaries and stay as stored; o_proj's 256 -> 2 x 128 columns cannot, so that tensor is dequantized. Tokens
    equal TP=1's and transformers' on the same file."""
    from rtp_llm import LLM
    from tests.models.tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(str(tmp_path / "tiny_q4_k.gguf"), "Q4_K")
    prompts = [[1, 504, 3458, 6353, 28, 17], list(range(100, 140))]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    outs = {}
    for tp in (1, 2):
        with LLM(path, tp_size=tp, kv_cache_memory_gb=0.05, max_model_len=256,
                 device_options={"cpu_gguf_blocks": "on"}) as llm:
            layer = llm.core.runner.model.layers[0]
            assert layer.mlp.down.quantized.format == "Q4_K" and layer.mlp.down.quantized.shape == (256, 512 // tp)
            assert layer.mlp.gate_up.quantized.shape == (2 * 512 // tp, 256)
            assert (layer.o.quantized is None) == (tp == 2)  # TP=2: dense (its kernel's packed float copy)
            outs[tp] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs[1] == outs[2]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny_q4_k.gguf", dtype=torch.float32).eval()
    for prompt, tokens in zip(prompts, outs[2]):
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=2)
        assert tokens == ref[0, len(prompt):].tolist()


def test_bad_tp_settings_are_refused_before_anything_starts(tmp_path, monkeypatch):
    from rtp_llm.errors import LaunchError, ShardingError

    make_checkpoint(tmp_path, "qwen3_kv1_tied")  # 4 query heads
    with pytest.raises(ShardingError, match="attention heads"):
        EngineCore(EngineConfig(model=str(tmp_path), tokenizer=default_model_path(), tp_size=5, num_blocks=64))
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(LaunchError, match="WORLD_SIZE=3 but tp_size=2"):
        EngineCore(EngineConfig(model=str(tmp_path), tokenizer=default_model_path(), tp_size=2, num_blocks=64))
