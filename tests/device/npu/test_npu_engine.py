"""The whole engine on the emulated NPU (--device npu on CPU): greedy tokens identical to the CPU
backend and to transformers; the seed's pitfalls reintroduced one by one are caught; the NPU path
neither reshuffles the cache nor copies KV or logits to the host."""

import dataclasses

import pytest
import torch

from tests.npu_emulator.install import install

torch_npu = install()

from rtp_llm.config.engine_config import EngineConfig  # noqa: E402
from rtp_llm.device import resolve_device  # noqa: E402
from rtp_llm.device.npu.attention import AscendAttention  # noqa: E402
from rtp_llm.models.default_model import default_model_path  # noqa: E402
from rtp_llm.sampling import SamplingParams  # noqa: E402
from rtp_llm.tokenizer import Tokenizer  # noqa: E402
from tests.engine.helpers import driver, run_all  # noqa: E402
from tests.models.tiny_checkpoints import make_checkpoint  # noqa: E402

SHARED = [(i * 11) % 240 + 5 for i in range(260)]                      # > 2 blocks of 128
PROMPTS = [SHARED[:150] + [7, 8, 9], [5, 6, 7, 8], SHARED[:140] + [1, 2], list(range(30, 70))]
MAX_TOKENS = [12, 20, 8, 16]
ARRIVALS = [0, 0, 6, 3]  # request 2 arrives after request 0 has filled its first block


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.load(default_model_path())


def engine(path, tok, device, **kw):
    args = dict(device=device, num_blocks=24, max_model_len=512, max_num_batched_tokens=512)
    args.update(kw)
    return driver(EngineConfig(model=str(path), **args), tokenizer=tok)


def staggered(eng):
    return run_all(eng, [(ARRIVALS[i], f"r{i}", PROMPTS[i], greedy(MAX_TOKENS[i])) for i in range(len(PROMPTS))])


def hf_greedy(hf, prompt, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_auto_picks_the_npu_and_npu_block_sizes_are_validated(tmp_path, tok):
    assert resolve_device("auto") == "npu"
    make_checkpoint(tmp_path, "llama_hd64")
    with pytest.raises(ValueError, match="block_size 16 is not supported on NPU"):
        engine(tmp_path, tok, "npu", block_size=16)


@pytest.mark.parametrize("variant", ["qwen3_hd64", "qwen2_hd64", "llama_hd64"])
@pytest.mark.parametrize("chunk", [None, 37])
def test_tiny_models_match_cpu_and_transformers(tmp_path, tok, variant, chunk):
    hf = make_checkpoint(tmp_path, variant)
    hf.generation_config.eos_token_id = None
    npu_eng = engine(tmp_path, tok, "npu", max_prefill_chunk=chunk)
    assert npu_eng.runner.attn.name == "ascend" and npu_eng.block_size == 128
    on_npu = staggered(npu_eng)
    on_cpu = staggered(engine(tmp_path, tok, "cpu", block_size=16, num_blocks=200, max_prefill_chunk=chunk))
    for i, prompt in enumerate(PROMPTS):
        ours = on_npu[f"r{i}"].outputs[0].token_ids
        assert ours == on_cpu[f"r{i}"].outputs[0].token_ids, f"request {i}"
        assert ours == hf_greedy(hf, prompt, MAX_TOKENS[i]), f"request {i}"
    # Request 2 shared two 128-token blocks with request 0: a prefix hit on the NPU path.
    assert on_npu["r2"].num_cached_tokens == 128
    assert npu_eng.stats()["kv_used_blocks"] == 0


def test_preemption_on_the_npu(tmp_path, tok):
    hf = make_checkpoint(tmp_path, "llama_hd64")
    # 3 usable blocks of 128; two 120-token prompts each cross into a second block while decoding.
    eng = engine(tmp_path, tok, "npu", num_blocks=4, max_model_len=256)
    prompts = [SHARED[:120], list(range(10, 130))]
    done = run_all(eng, [(0, f"p{i}", p, greedy(20)) for i, p in enumerate(prompts)])
    assert eng.scheduler.num_preemptions > 0
    for i, prompt in enumerate(prompts):
        assert done[f"p{i}"].outputs[0].token_ids == hf_greedy(hf, prompt, 20)


def test_smollm2_on_the_npu_matches_cpu(tok):
    path = default_model_path()
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
               for q in ("What is the capital of France?", "Name a color.")]
    res = {}
    for dev in ("npu", "cpu"):
        eng = driver(EngineConfig(model=path, device=dev, max_model_len=512, num_blocks=16 if dev == "npu" else 128),
                     tokenizer=tok)
        out = run_all(eng, [(i, f"p{i}", p, greedy(12)) for i, p in enumerate(prompts)])
        res[dev] = [out[f"p{i}"].outputs[0].token_ids for i in range(len(prompts))]
    assert res["npu"] == res["cpu"]
    assert "Paris" in tok.decode(res["npu"][0])


def test_no_cache_reshuffle_and_no_host_copy_of_kv_or_logits(tmp_path, tok):
    make_checkpoint(tmp_path, "qwen3_hd64")
    eng = engine(tmp_path, tok, "npu")
    eng.add_request("a", PROMPTS[0], greedy(4))
    eng.add_request("b", PROMPTS[1], greedy(4))
    vocab = eng.model_config.vocab_size
    with torch_npu.monitor(watch=(eng.runner.kv.buffer,)) as records:
        while eng.has_unfinished():
            eng.step()
    assert [r for r in records if r[0] == "cache_op"] == []
    big = [r for r in records if r[0] == "d2h" and torch.Size(r[1]).numel() >= vocab]
    assert big == [], f"host copies of logits/KV-sized tensors: {big}"
    assert any(r[0] == "d2h" for r in records)  # the monitor does see the (small) token-id copies


def test_the_monitor_catches_a_cache_permute(tmp_path, tok):
    """The guard above is not vacuous: a phase-1 style permute().contiguous() of the cache is seen."""
    make_checkpoint(tmp_path, "qwen3_hd64")
    eng = engine(tmp_path, tok, "npu")
    with torch_npu.monitor(watch=(eng.runner.kv.buffer,)) as records:
        eng.runner.kv.layer(0)[0].permute(0, 2, 1, 3).contiguous()
    assert records and records[0][0] == "cache_op"


class _Pitfall(AscendAttention):
    """AscendAttention with one of the seed's pitfalls put back."""
    kind = ""

    def forward(self, q, k, v, layer_kv, meta):
        m = dataclasses.replace(meta)
        nb, bs = layer_kv.shape[1], layer_kv.shape[2]
        if self.kind == "leading_zero":
            m.q_cum = [0] + m.q_cum
        elif self.kind == "cumulative_kv":
            m.kv_lens = [sum(m.kv_lens[: i + 1]) for i in range(len(m.kv_lens))]
        elif self.kind == "off_by_one":
            m.kv_lens = [x - 1 for x in m.kv_lens]
        elif self.kind == "block_table_3d":
            m.block_table = m.block_table.unsqueeze(0)
        elif self.kind == "block_table_host":
            m.block_table = m.block_table.cpu()
        if self.kind == "no_mask":
            self._mask = None
            orig = self._template_mask
            self._template_mask = lambda device: None
        if self.kind == "noncontiguous_cache":
            # every other block of the BnBsH view: a strided, non-contiguous cache view
            k_cache, v_cache = layer_kv[0], layer_kv[1]
            self.torch_npu.npu_scatter_pa_kv_cache(k.contiguous(), v.contiguous(), k_cache, v_cache, m.slots,
                                                   cache_mode="Norm")
            return self.torch_npu.npu_fused_infer_attention_score(
                q, k_cache.view(nb, bs, -1)[::2], v_cache.view(nb, bs, -1)[::2],
                atten_mask=self._template_mask(q.device), actual_seq_lengths=m.q_cum, actual_seq_lengths_kv=m.kv_lens,
                block_table=m.block_table, num_heads=self.num_heads, scale=self.scale, input_layout="TND",
                num_key_value_heads=self.num_kv_heads, sparse_mode=3, block_size=bs)[0]
        try:
            return super().forward(q, k, v, layer_kv, m)
        finally:
            if self.kind == "no_mask":
                self._template_mask = orig


@pytest.mark.parametrize("kind,match", [
    ("leading_zero", "empty sequence"),
    ("cumulative_kv", "exceeds"),
    ("off_by_one", None),
    ("no_mask", "atten_mask must not be null"),
    ("block_table_3d", "2-D"),
    ("block_table_host", "host-side"),
    ("noncontiguous_cache", "contiguous"),
])
def test_each_pitfall_is_caught(tmp_path, tok, kind, match):
    hf = make_checkpoint(tmp_path, "llama_hd64")
    eng = engine(tmp_path, tok, "npu", num_blocks=40)
    pit = _Pitfall(eng.runner.attn.num_heads, eng.runner.attn.num_kv_heads, eng.runner.attn.head_dim,
                   eng.runner.attn.scale, eng.block_size)
    pit.kind = kind
    eng.runner.attn = pit
    # three sequences in one step; cumulative KV lengths (259, 459, 499) overrun the 3-block table rows
    prompts = [SHARED[:259], list(range(5, 205)), SHARED[:40]]
    for i, p in enumerate(prompts):
        eng.add_request(f"p{i}", p, greedy(3))
    if match is not None:
        outs = []
        while eng.has_unfinished():
            outs += eng.step()
        errors = [o.error for o in outs if o.finished and o.error]
        assert errors and any(match in e for e in errors), errors
    else:
        done = {}
        while eng.has_unfinished():
            for o in eng.step():
                if o.finished:
                    done[o.request_id] = o.outputs[0].token_ids
        # The op runs, but the emulator computes the documented math over one key too few: wrong tokens.
        assert [done[f"p{i}"] for i in range(len(prompts))] != [hf_greedy(hf, p, 3) for p in prompts]
