"""Batch invariance, the README's guarantee: a request's tokens and logprobs are bit for bit the same whether it
runs alone or among many others, wherever it sits in the batch, whatever the prefill chunk size, whether its
prefix came from the cache and whether it was preempted and recomputed; for greedy and seeded sampling, in
float32 and bfloat16, on the CPU device's kernels (what the server runs)."""

import random

import pytest

from rtp_llm.sampling import SamplingParams
from tests.engine.helpers import Tiny, run_all

TARGET = [(i * 11 + 5) % 250 + 3 for i in range(37)]
MODES = {"greedy": dict(temperature=0), "seeded": dict(temperature=0.9, top_p=0.95, seed=1234)}


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny(request, tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp(f"tiny_{request.param}"), dtype=request.param, device_ops=True)


def params(mode, **kw):
    return SamplingParams(max_tokens=14, ignore_eos=True, logprobs=4, **MODES[mode], **kw)


def signature(out):
    o = out.outputs[0]
    return o.token_ids, [(lp.token_id, lp.logprob, tuple(lp.top)) for lp in o.logprobs]


def crowd(seed, n, longest=60):
    """n other requests of mixed lengths and sampling, arriving over the first steps."""
    rng = random.Random(seed)
    others = []
    for i in range(n):
        prompt = [rng.randrange(3, 250) for _ in range(rng.randrange(1, longest))]
        sp = SamplingParams(max_tokens=rng.randrange(1, 30), ignore_eos=True, temperature=rng.choice([0, 0.7, 1.2]),
                            seed=rng.randrange(1000), logprobs=rng.choice([None, 2]))
        others.append((rng.randrange(0, 6), f"o{seed}.{i}", prompt, sp))
    return others


@pytest.mark.parametrize("mode", list(MODES))
def test_a_request_is_the_same_alone_and_in_any_batch(tiny, mode):
    alone = signature(run_all(tiny.engine(), [(0, "t", TARGET, params(mode))])["t"])
    runs = {
        # first, in the middle, last of a full step; arriving while others decode
        "first of 15": [(0, "t", TARGET, params(mode))] + crowd(1, 15),
        "middle of 15": crowd(2, 7) + [(0, "t", TARGET, params(mode))] + crowd(3, 8),
        "arrives late": crowd(4, 15) + [(4, "t", TARGET, params(mode))],
    }
    for name, arrivals in runs.items():
        got = run_all(tiny.engine(), arrivals)["t"]
        assert signature(got) == alone, name
    for chunk in (1, 5, 16):
        got = run_all(tiny.engine(max_prefill_chunk=chunk), crowd(5, 6) + [(1, "t", TARGET, params(mode))])["t"]
        assert signature(got) == alone, f"prefill chunk {chunk}"
    # Its prefix cached by an earlier request (the suffix alone computed), then a recompute after preemption.
    engine = tiny.engine()
    run_all(engine, [(0, "warm", TARGET[:30], SamplingParams(max_tokens=1, temperature=0))])
    got = run_all(engine, [(0, "t", TARGET, params(mode))])["t"]
    assert got.num_cached_tokens == 28 and signature(got) == alone, "cached prefix"
    engine = tiny.engine(num_blocks=30, max_model_len=64, max_num_seqs=8)  # 29 blocks of 4 for ~8 x 50 tokens
    got = run_all(engine, [(0, "t", TARGET, params(mode))] + crowd(6, 7, longest=30))["t"]
    assert engine.scheduler.num_preemptions > 0
    assert signature(got) == alone, "preempted"
