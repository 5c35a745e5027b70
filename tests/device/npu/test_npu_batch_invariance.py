"""Batch invariance on the emulated NPU (bfloat16, the documented torch_npu math): a request's tokens and logprobs
are bit for bit the same alone, among others, whatever the prefill chunk, after a cached prefix and after a
preemption, greedy and seeded. (On a real Ascend device the fused kernels are CANN's; this checks the engine's side:
the batch the NPU path builds never changes what one request's rows compute.)"""

import random

import pytest

from tests.npu_emulator.install import install

torch_npu = install()

from rtp_llm.sampling import SamplingParams  # noqa: E402
from tests.device.npu.helpers import engine, tok  # noqa: E402,F401  (tok: a fixture)
from tests.engine.helpers import run_all  # noqa: E402
from tests.models.tiny_checkpoints import make_checkpoint  # noqa: E402

TARGET = [(i * 11 + 5) % 250 + 3 for i in range(150)]  # more than one 128-token block: a prefix can be cached
MODES = {"greedy": dict(temperature=0), "seeded": dict(temperature=0.9, top_p=0.95, seed=99)}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("npu_inv")
    make_checkpoint(path, "qwen3_hd64")
    return path


def params(mode):
    return SamplingParams(max_tokens=10, ignore_eos=True, logprobs=4, **MODES[mode])


def signature(out):
    o = out.outputs[0]
    return o.token_ids, [(lp.token_id, lp.logprob, tuple(lp.top)) for lp in o.logprobs]


def crowd(seed, n, longest=120):
    """n other requests of mixed lengths and sampling, arriving over the first steps."""
    rng = random.Random(seed)
    return [(rng.randrange(0, 4), f"o{seed}.{i}", [rng.randrange(3, 250) for _ in range(rng.randrange(1, longest))],
             SamplingParams(max_tokens=rng.randrange(1, 12), ignore_eos=True, temperature=rng.choice([0, 1.0]),
                            seed=rng.randrange(100))) for i in range(n)]


@pytest.mark.parametrize("mode", list(MODES))
def test_a_request_is_the_same_alone_and_in_any_batch_on_the_npu(model, tok, mode):  # noqa: F811 (the fixture)
    alone = signature(run_all(engine(model, tok, "npu"), [(0, "t", TARGET, params(mode))])["t"])
    got = run_all(engine(model, tok, "npu"), crowd(1, 6) + [(1, "t", TARGET, params(mode))] + crowd(2, 4))["t"]
    assert signature(got) == alone, "batch"
    for chunk in (5, 64):
        got = run_all(engine(model, tok, "npu", max_prefill_chunk=chunk), [(0, "t", TARGET, params(mode))])["t"]
        assert signature(got) == alone, f"prefill chunk {chunk}"
    eng = engine(model, tok, "npu")
    run_all(eng, [(0, "warm", TARGET[:140], SamplingParams(max_tokens=1, temperature=0))])
    got = run_all(eng, [(0, "t", TARGET, params(mode))])["t"]
    assert got.num_cached_tokens == 128 and signature(got) == alone, "cached prefix"
    # 4 blocks of 128: the target takes 2, two others of 120-127 tokens one each, and their decodes cross into a
    # second block each, so someone is preempted.
    eng = engine(model, tok, "npu", num_blocks=5, max_model_len=256)
    rng = random.Random(3)
    edge = [(0, f"e{i}", [rng.randrange(3, 250) for _ in range(120 + i)], SamplingParams(max_tokens=12, ignore_eos=True,
            temperature=0)) for i in range(3)]
    got = run_all(eng, [(0, "t", TARGET, params(mode))] + edge)["t"]
    assert eng.scheduler.num_preemptions > 0
    assert signature(got) == alone, "preempted"


def test_prompt_logprobs_on_the_npu(model, tok):  # noqa: F811 (the fixture)
    """Every prompt row's logits on the NPU path: complete, the same whatever the chunking, within bf16 rounding of
    transformers in bf16."""
    import torch

    from transformers import AutoModelForCausalLM

    sp = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=2)
    runs = [run_all(engine(model, tok, "npu", max_prefill_chunk=c), [(0, "a", TARGET, sp)])["a"] for c in (None, 16)]
    entries = [[(x.token_id, x.logprob, tuple(x.top)) for x in r.prompt_logprobs[1:]] for r in runs]
    assert runs[0].prompt_logprobs[0] is None and len(entries[0]) == len(TARGET) - 1
    assert entries[0] == entries[1]
    hf = AutoModelForCausalLM.from_pretrained(str(model), torch_dtype=torch.bfloat16)
    with torch.no_grad():
        ref = hf(torch.tensor([TARGET])).logits[0].float().log_softmax(-1)
    got = torch.tensor([e[1] for e in entries[0]])
    want = ref[torch.arange(len(TARGET) - 1), torch.tensor(TARGET[1:])]
    torch.testing.assert_close(got, want, atol=0.05, rtol=0)  # bf16: ~2^-8 of logits near 10


def test_speculation_changes_no_output_bit_on_the_npu(model, tok):  # noqa: F811 (the fixture)
    """N-gram drafts verified in the emulated NPU's mixed TND batch: tokens and logprobs as without speculation."""
    spec = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
            "disable_by_batch_size": 16}
    arrivals = [(0, "t", TARGET, params(m)) for m in ["greedy"]] + [(1, "s", TARGET[:60], params("seeded"))]
    plain = run_all(engine(model, tok, "npu"), arrivals)
    eng = engine(model, tok, "npu", speculative_config=spec)
    got = run_all(eng, arrivals)
    assert {r: signature(o) for r, o in got.items()} == {r: signature(o) for r, o in plain.items()}
    s = eng.stats()
    assert s["spec_decode_num_accepted_tokens"] > 0 and s["kv_used_blocks"] == 0
    with pytest.raises(ValueError, match="16 query tokens"):
        engine(model, tok, "npu", speculative_config=dict(spec, num_speculative_tokens=16))
