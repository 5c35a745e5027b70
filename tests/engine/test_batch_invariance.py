"""Batch invariance, the README's guarantee: a request's tokens and logprobs are bit for bit the same whether it
runs alone or among many others, wherever it sits in the batch, whatever the prefill chunk size, whether its
prefix came from the cache and whether it was preempted and recomputed; for greedy and seeded sampling, in
float32 and bfloat16, on the CPU device's kernels (what the server runs)."""

import pytest

from rtp_llm.sampling import SamplingParams
from tests.engine.helpers import Tiny, run_all
from tests.engine.invariance import MODES, TARGET, crowd, params, signature


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny(request, tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp(f"tiny_{request.param}"), dtype=request.param, device_ops=True)


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
