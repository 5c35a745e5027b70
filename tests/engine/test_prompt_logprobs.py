"""prompt_logprobs (vLLM's): every prompt token's logprob under the model, checked against transformers' logits on
the same weights, and the same whatever the prefill chunk size, the batch around it, a cached prefix (which a
request asking for them does not use: a cached position has no logits) or a preemption in the middle."""

import math

import pytest
import torch

from rtp_llm.errors import RequestRejected
from tests.engine.helpers import Tiny, greedy, run_all

PROMPT = [(i * 11 + 5) % 250 + 3 for i in range(37)]
OTHER = [(i * 3 + 1) % 250 + 3 for i in range(23)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # The CPU device's kernels, as the server runs them: their rows do not depend on the batch.
    return Tiny(tmp_path_factory.mktemp("tiny"), device_ops=True)


@pytest.fixture(scope="module")
def reference(tiny):
    """transformers' log-probabilities of each next prompt token: row j predicts token j + 1."""
    with torch.no_grad():
        return tiny.hf(torch.tensor([PROMPT])).logits[0].double().log_softmax(-1)


def _as_tuples(lps):
    return [None if lp is None else (lp.token_id, lp.logprob, lp.rank, tuple(lp.top)) for lp in lps]


def test_prompt_logprobs_match_transformers(tiny, reference):
    out = run_all(tiny.engine(), [(0, "a", PROMPT, greedy(4, prompt_logprobs=5))])["a"]
    lps = out.prompt_logprobs
    assert len(lps) == len(PROMPT) and lps[0] is None
    for j in range(1, len(PROMPT)):
        ref = reference[j - 1]
        assert lps[j].token_id == PROMPT[j]
        assert lps[j].logprob == pytest.approx(ref[PROMPT[j]].item(), abs=1e-4)
        # Rank: 1 + the tokens more likely than it (a near tie may fall either way).
        chosen = ref[PROMPT[j]].item()
        assert int((ref > chosen + 1e-4).sum()) + 1 <= lps[j].rank <= int((ref > chosen - 1e-4).sum()) + 1
        top_ids = [t for t, _ in lps[j].top]
        assert len(top_ids) == 5
        assert [v for _, v in lps[j].top] == pytest.approx(ref[top_ids].tolist(), abs=1e-4)
        assert min(v for _, v in lps[j].top) >= ref.topk(5).values[-1].item() - 1e-4  # the 5 most likely
    # Asking for them changes nothing about the answer.
    assert out.outputs[0].token_ids == tiny.greedy(PROMPT, 4)


def test_zero_gives_the_prompt_tokens_only(tiny, reference):
    lps = run_all(tiny.engine(), [(0, "a", PROMPT, greedy(2, prompt_logprobs=0))])["a"].prompt_logprobs
    assert all(lp.top == [] for lp in lps[1:])
    assert lps[5].logprob == pytest.approx(reference[4][PROMPT[5]].item(), abs=1e-4)


def test_a_one_token_prompt_has_only_the_null_entry(tiny):
    out = run_all(tiny.engine(), [(0, "a", [42], greedy(3, prompt_logprobs=2))])["a"]
    assert out.prompt_logprobs == [None]
    assert out.outputs[0].token_ids == tiny.greedy([42], 3)


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_identical_whatever_the_chunking_batch_and_cache(tiny, chunk):
    alone = run_all(tiny.engine(), [(0, "a", PROMPT, greedy(6, prompt_logprobs=3))])["a"]
    engine = tiny.engine(max_prefill_chunk=chunk)
    # The prompt is cached first (a request without prompt logprobs), then asked for again with them, next to others.
    run_all(engine, [(0, "warm", PROMPT, greedy(2))])
    done = run_all(engine, [(0, "x", OTHER, greedy(9)), (0, "a", PROMPT, greedy(6, prompt_logprobs=3)),
                            (2, "b", PROMPT, greedy(6)), (3, "c", PROMPT + [7], greedy(6, prompt_logprobs=3))])
    assert done["a"].num_cached_tokens == 0 and done["a"].metrics["computed_prompt_tokens"] == len(PROMPT)
    assert _as_tuples(done["a"].prompt_logprobs) == _as_tuples(alone.prompt_logprobs)  # bit for bit
    assert done["c"].prompt_logprobs[:len(PROMPT)] == done["a"].prompt_logprobs
    assert done["a"].outputs[0].token_ids == done["b"].outputs[0].token_ids == alone.outputs[0].token_ids
    assert done["b"].num_cached_tokens > 0  # the others still use the cache (and the blocks "a" computed)
    assert engine.stats()["kv_used_blocks"] == 0


def test_a_preempted_request_keeps_complete_prompt_logprobs(tiny):
    alone = run_all(tiny.engine(), [(0, "a", PROMPT, greedy(20, prompt_logprobs=2))])["a"]
    # 16 usable blocks of 4 tokens: the three requests (43, 57 and 29 tokens) cannot all stay.
    engine = tiny.engine(num_blocks=17, max_model_len=64, max_prefill_chunk=8)
    done = run_all(engine, [(0, "x", OTHER, greedy(20)), (0, "a", PROMPT, greedy(20, prompt_logprobs=2)),
                            (1, "y", OTHER[:9], greedy(20))])
    assert engine.scheduler.num_preemptions > 0
    assert _as_tuples(done["a"].prompt_logprobs) == _as_tuples(alone.prompt_logprobs)
    assert done["a"].outputs[0].token_ids == alone.outputs[0].token_ids
    assert engine.stats()["kv_used_blocks"] == 0


def test_n_samples_share_one_prompt_computation(tiny):
    out = run_all(tiny.engine(), [(0, "a", PROMPT, greedy(3, n=3, prompt_logprobs=1, seed=1))])["a"]
    alone = run_all(tiny.engine(), [(0, "a", PROMPT, greedy(3, prompt_logprobs=1))])["a"]
    assert _as_tuples(out.prompt_logprobs) == _as_tuples(alone.prompt_logprobs)
    assert len(out.outputs) == 3


def test_whole_vocabulary_and_the_cap(tiny):
    engine = tiny.engine(max_logprobs=-1)
    out = run_all(engine, [(0, "a", PROMPT[:4], greedy(2, prompt_logprobs=-1, logprobs=-1))])["a"]
    vocab = tiny.cfg.vocab_size
    for lp in out.prompt_logprobs[1:] + out.outputs[0].logprobs:
        assert len(lp.top) == vocab and len({t for t, _ in lp.top}) == vocab
        assert math.fsum(math.exp(v) for _, v in lp.top) == pytest.approx(1.0, abs=1e-4)
    capped = tiny.engine()  # max_logprobs 20, as vLLM's default
    for field, value in (("prompt_logprobs", 21), ("prompt_logprobs", -1), ("logprobs", -1), ("logprobs", 21)):
        with pytest.raises(RequestRejected, match=f"{field}.*max_logprobs=20") as info:
            capped.add_request("r", PROMPT, greedy(2, **{field: value}))
        assert info.value.param == field
    assert capped.stats()["waiting"] == 0


def test_the_core_refuses_an_unresolved_count(tiny):
    """-1 is resolved by the input processor; a request that skips it is refused by name, not run without logprobs."""
    from rtp_llm.engine.protocol import EngineRequest

    core = tiny.engine().core
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(RequestRejected, match=f"{field}: -1 is not a count") as info:
            core.add_request(EngineRequest(f"r-{field}", PROMPT, greedy(2, **{field: -1})))
        assert info.value.param == field
    assert not core.has_unfinished()
