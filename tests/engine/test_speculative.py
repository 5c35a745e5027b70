"""Speculative decoding changes no output bit: with n-gram drafts a request's tokens, logprobs and top logprobs are
the same as without speculation, for greedy and seeded sampling with penalties, logit_bias, min_tokens, stop strings,
n > 1 and structured outputs, among other requests, with chunked prefill, prefix caching and preemption, in
float32 and bfloat16; rejected drafts leave no KV block and no prefix-cache entry behind."""

import random

import numpy as np
import pytest

from rtp_llm.config.speculative_config import SpeculativeConfig
from rtp_llm.sampling import SamplingParams
from rtp_llm.spec_decode.ngram import ngram_drafts
from tests.engine.helpers import Tiny, repetitive, run_all

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
         "disable_by_batch_size": 64}  # every step speculates
LOOKUP = {"method": "lookup", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "disable_by_batch_size": 64}


def _brute_force_drafts(tokens, lo, hi, k):
    """The longest suffix (hi down to lo tokens) seen earlier with something after it; its latest such occurrence."""
    n = len(tokens)
    for size in range(min(hi, n - 1), lo - 1, -1):
        suffix = tokens[n - size:]
        for start in range(n - size - 1, -1, -1):
            if tokens[start:start + size] == suffix:
                return tokens[start + size:start + size + k]
    return []


def test_ngram_drafts_match_a_plain_search():
    rng = random.Random(0)
    for _ in range(3000):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        lo = rng.randrange(1, 4)
        hi = lo + rng.randrange(0, 4)
        k = rng.randrange(1, 6)
        assert ngram_drafts(np.asarray(tokens), lo, hi, k) == _brute_force_drafts(tokens, lo, hi, k), (tokens, lo, hi)


def _brute_force_lookup(tokens, hi, k):
    """Lookup decoding written out: a run of hi tokens seen before continues as "ngram" does; else, token by token,
    the longest suffix (hi down to 1) seen with something after it decides: its most frequent follower (ties: the
    latest), if seen often enough and with a large enough share (llama.cpp's lax thresholds), else no more drafts."""
    run = _brute_force_drafts(tokens, hi, hi, k)
    if run:
        return run
    seq, out = list(tokens), []
    for _ in range(k):
        pick = None
        for n in range(min(hi, len(seq)), 0, -1):
            suffix = seq[len(seq) - n:]
            after = [(seq[i + n], i + n) for i in range(len(tokens) - n) if tokens[i:i + n] == suffix]
            if not after:
                continue
            counts = {}
            for t, pos in after:
                c, last = counts.get(t, (0, -1))
                counts[t] = (c + 1, max(last, pos))
            token, (count, _) = max(counts.items(), key=lambda kv: kv[1])
            seen, share = [(2, 66), (2, 50), (1, 50), (1, 50)][min(n, 4) - 1]
            pick = token if len(after) >= seen and count * 100 >= share * len(after) else None
            break
        if pick is None:
            break
        out.append(pick)
        seq.append(pick)
    return out


def test_lookup_drafts_match_a_plain_search():
    """The proposer's counts, extended a few tokens at a time as a sequence grows, against the search above (only
    the context's own n-grams count: never its drafts)."""
    from rtp_llm.spec_decode.lookup import LookupProposer

    class Seq:
        def __init__(self, tokens):
            self.seq_id, self.tokens = 1, tokens

        def all_tokens(self):
            return self.tokens

    rng = random.Random(1)
    for _ in range(300):
        hi, k = rng.randrange(1, 5), rng.randrange(1, 6)
        proposer, tokens = LookupProposer(hi), []
        for _ in range(rng.randrange(1, 8)):
            tokens = tokens + [rng.randrange(5) for _ in range(rng.randrange(1, 9))]
            assert proposer.propose([Seq(tokens)], [k]) == [_brute_force_lookup(tokens, hi, k)], (tokens, hi, k)
        proposer.release(Seq(tokens))
        assert not proposer.counts


def test_speculative_config_is_read_as_vllm_reads_it():
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)
    c = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (4, 4)
    assert SpeculativeConfig.parse({"model": "/d", "num_speculative_tokens": 2}).method == "draft_model"
    assert SpeculativeConfig.parse("") is None and SpeculativeConfig.parse({}) is None
    assert SpeculativeConfig.parse({"method": "lookup", "num_speculative_tokens": 3}).prompt_lookup_max == 4
    for bad, word in [({"method": "eagle", "num_speculative_tokens": 2}, "method"),
                      ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                      ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
                        "prompt_lookup_max": 2}, "prompt_lookup_min"),
                      ({"method": "ngram", "num_speculative_tokens": 2, "acceptance": 1}, "acceptance"),
                      ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
                      ({"method": "lookup", "num_speculative_tokens": 2, "prompt_lookup_min": 2},
                       "no prompt_lookup_min"),
                      ({"method": "lookup", "num_speculative_tokens": 2, "dtype": "float32"}, "dtype"),
                      ("{not json", "JSON")]:
        with pytest.raises(ValueError, match=word):
            SpeculativeConfig.parse(bad)
    with pytest.raises(ValueError, match="16 query tokens"):
        SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 16}).check_query_limit(16, "npu")
    SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 15}).check_query_limit(16, "npu")
    SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 64}).check_query_limit(None, "cpu")


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny(request, tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp(f"tiny_{request.param}"), dtype=request.param, device_ops=True)


def _workload():
    rng = random.Random(7)
    prompts = [repetitive(rng, n) for n in (37, 12, 60, 25, 44)]
    shared = prompts[2][:40]
    p = lambda **kw: SamplingParams(max_tokens=40, ignore_eos=True, logprobs=3, **kw)  # noqa: E731
    return [
        (0, "greedy", prompts[0], p(temperature=0)),
        (0, "seeded", prompts[1], p(temperature=0.8, top_p=0.9, seed=11)),
        (1, "penalised", prompts[2], p(temperature=0.7, seed=5, presence_penalty=0.4, frequency_penalty=0.3,
                                       repetition_penalty=1.1, logit_bias={17: 3.0, 42: -5.0})),
        (2, "min-tokens", prompts[3], SamplingParams(max_tokens=30, min_tokens=12, temperature=0, logprobs=1,
                                                     stop_token_ids=[prompts[3][5], prompts[3][6]])),
        (2, "n2", prompts[4], p(temperature=1.0, seed=3, n=2)),
        (3, "prefix-hit", shared + [9, 8, 7], p(temperature=0)),
        (4, "short", prompts[0][:9], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)),
    ]


def _signatures(done):
    return {rid: ([signature_of(o) for o in out.outputs], out.num_cached_tokens, [o.finish_reason for o in out.outputs])
            for rid, out in done.items()}


def signature_of(o):
    return o.token_ids, o.text, [(lp.token_id, lp.logprob, tuple(lp.top)) for lp in (o.logprobs or [])]


def _run(tiny, spec, **kw):
    args = dict(max_prefill_chunk=7, num_blocks=400)
    args.update(kw)
    engine = tiny.engine(speculative_config=spec, **args)
    done = run_all(engine, _workload())
    return done, engine


@pytest.mark.parametrize("config", [NGRAM, LOOKUP], ids=["ngram", "lookup"])
def test_speculation_changes_no_output_bit(tiny, config):
    plain, plain_engine = _run(tiny, None)
    spec, engine = _run(tiny, config)
    assert _signatures(spec) == _signatures(plain)
    s = engine.stats()
    # Both paths ran: drafts kept and drafts rejected.
    assert 0 < s["spec_decode_num_accepted_tokens"] < s["spec_decode_num_draft_tokens"]
    assert s["spec_decode_num_accepted_tokens_per_pos"][0] >= s["spec_decode_num_accepted_tokens_per_pos"][-1]
    assert s["generation_tokens"] == plain_engine.stats()["generation_tokens"]
    # Every block back; the prefix cache holds exactly what plain decoding cached (no rejected draft's block).
    assert s["kv_used_blocks"] == 0 and engine.scheduler.manager.stats().num_sequences == 0
    assert engine.scheduler.manager.stats().cache_entries == plain_engine.scheduler.manager.stats().cache_entries


def test_speculation_under_preemption(tiny):
    plain, _ = _run(tiny, None, num_blocks=40, max_model_len=128)
    spec, engine = _run(tiny, NGRAM, num_blocks=40, max_model_len=128)
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert _signatures(spec) == _signatures(plain)
    assert engine.stats()["kv_used_blocks"] == 0


def test_stop_string_inside_an_accepted_run(tiny):
    prompt = repetitive(random.Random(2), 50)  # its greedy continuation falls into a loop n-grams predict
    base = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    free = run_all(tiny.engine(), [(0, "r", prompt, base)])["r"].outputs[0].text
    # a stop string first seen late in the text, where the loop's drafts are being accepted
    at = next(i for i in range(len(free) * 2 // 3, len(free)) if free.find(free[i:i + 3]) == i)
    stop = free[at:at + 3]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop=[stop])
    plain = run_all(tiny.engine(), [(0, "r", prompt, params)])["r"].outputs[0]
    engine = tiny.engine(speculative_config=NGRAM)
    spec = run_all(engine, [(0, "r", prompt, params)])["r"].outputs[0]
    assert plain.finish_reason == "stop" and stop not in plain.text
    assert (spec.text, spec.token_ids, spec.finish_reason) == (plain.text, plain.token_ids, plain.finish_reason)
    # greedy without logprobs: the model's own argmax head verified the drafts
    assert engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert engine.stats()["kv_used_blocks"] == 0


@pytest.mark.parametrize("proposer", ["ngram", "draft_model"])
def test_structured_output_under_speculation(tiny, drafts, proposer):
    # A regex whose matches repeat: the grammar walks along the drafts and back; a draft model's drafts that the
    # grammar refuses are cut before verification.
    params = SamplingParams(max_tokens=40, temperature=0.9, seed=2, logprobs=2,
                            structured_outputs={"regex": "((ab|cd|ef) ){3,12}"})
    prompt = repetitive(random.Random(5), 30)
    plain = run_all(tiny.engine(), [(0, "r", prompt, params)])["r"].outputs[0]
    spec = NGRAM if proposer == "ngram" else {"method": "draft_model", "model": drafts["same"],
                                              "num_speculative_tokens": 3, "dtype": "bfloat16"}
    engine = tiny.engine(speculative_config=spec)
    spec = run_all(engine, [(0, "r", prompt, params)])["r"].outputs[0]
    assert signature_of(spec) == signature_of(plain)
    assert engine.stats()["spec_decode_num_draft_tokens"] > 0


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """Draft checkpoints for the tiny target: the same weights (its bf16 copy drafts well) and another model of the
    same vocabulary (its drafts are mostly rejected)."""
    from tests.models.tiny_checkpoints import make_checkpoint

    same = tmp_path_factory.mktemp("draft_same")
    make_checkpoint(same, "qwen3_gqa2_headdim32_untied")
    other = tmp_path_factory.mktemp("draft_other")
    make_checkpoint(other, "llama_gqa4_tied_attnbias")
    return {"same": str(same), "other": str(other)}


@pytest.mark.parametrize("draft,draft_dtype", [("same", "bfloat16"), ("other", None)])
def test_draft_model_changes_no_output_bit(tiny, drafts, draft, draft_dtype):
    spec = {"method": "draft_model", "model": drafts[draft], "num_speculative_tokens": 3,
            "disable_by_batch_size": 64}
    if draft_dtype:
        spec["dtype"] = draft_dtype
    plain, _ = _run(tiny, None)
    got, engine = _run(tiny, spec)
    assert _signatures(got) == _signatures(plain)
    s = engine.stats()
    if draft == "same":  # the same weights in another dtype mostly agree
        assert s["spec_decode_num_accepted_tokens"] > s["spec_decode_num_draft_tokens"] / 2
    else:  # another model: drafts kept and drafts rejected
        assert 0 < s["spec_decode_num_accepted_tokens"] < s["spec_decode_num_draft_tokens"]
    assert s["kv_used_blocks"] == 0
    proposer = engine.speculator.proposer
    assert proposer.manager.stats().num_sequences == 0 and proposer.manager.stats().used_blocks == 0


def test_draft_model_under_preemption(tiny, drafts):
    spec = {"method": "draft_model", "model": drafts["same"], "num_speculative_tokens": 2,
            "disable_by_batch_size": 64}
    plain, _ = _run(tiny, None, num_blocks=40, max_model_len=128)
    got, engine = _run(tiny, spec, num_blocks=40, max_model_len=128)
    assert engine.scheduler.num_preemptions > 0
    assert _signatures(got) == _signatures(plain)
    assert engine.speculator.proposer.manager.stats().num_sequences == 0


def _seqs(n, prompt, max_tokens=50):
    from rtp_llm.engine.sequence import Request, Sequence

    out = []
    for i in range(n):
        req = Request(f"r{i}", list(prompt), SamplingParams(max_tokens=max_tokens))
        req.sequences = [Sequence(i + 1, req, 0, seed=0, detok=None)]
        out += req.sequences
    return out


def _expected_k(acceptance, extra_row, k_max):
    """Tokens per cost of k drafts, each accepted with probability a after the one before: the k that maximises it,
    0 when none beats a plain step."""
    gains = {k: sum(acceptance ** j for j in range(k + 1)) / (1 + extra_row * k) for k in range(k_max + 1)}
    best = max(gains, key=lambda k: (gains[k], -k))
    return best if gains[best] > 1.0 else 0


def test_speculator_rules_batch_cap_back_off_and_draft_count():
    from rtp_llm.spec_decode import NgramProposer, Speculator
    from rtp_llm.spec_decode.speculator import _COST_PRIOR

    cfg = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 2, "disable_by_batch_size": 2})
    spec = Speculator(cfg, NgramProposer(1, 2), max_model_len=64)
    loop = [5, 6, 7, 8] * 4
    a, b, c = _seqs(3, loop)
    spec.propose([a, b, c])  # three decoding, more than disable_by_batch_size
    assert a.draft == b.draft == c.draft == []
    spec.propose([a, b])  # a new sequence is taken to accept 3 drafts in 4: all 4 pay
    assert a.draft == [5, 6, 7, 8] and b.draft == [5, 6, 7, 8]
    # max_tokens: the accepted drafts plus the bonus token must fit
    (d,) = _seqs(1, loop, max_tokens=3)
    spec.propose([d])
    assert d.draft == [5, 6]
    # all rejected m times in a row: 2^m - 1 steps without drafts, then as many drafts as pay at its record
    for misses, skipped in ((1, 1), (2, 3)):
        spec.verified(a, 4, 0)
        assert a.spec_misses == misses
        for _ in range(skipped):
            spec.propose([a])
            assert a.draft == []
        spec.propose([a])
        acc, rej = a.spec_record
        k = _expected_k(acc / (acc + rej), _COST_PRIOR, 4)
        assert len(a.draft) == max(k, 1) and a.draft == [5, 6, 7, 8][:len(a.draft)]
    a.spec_skip, a.spec_record = 0, (0.2, 3.0)  # acceptance so low that no draft pays: one probe, 7 steps without
    assert _expected_k(0.2 / 3.2, _COST_PRIOR, 4) == 0
    spec.propose([a])
    assert a.draft == [5]
    for _ in range(7):
        spec.propose([a])
        assert a.draft == []
    spec.verified(b, 4, 2)
    assert b.spec_misses == 0 and spec.accepted_per_pos == [1, 1, 0, 0]
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (3, 12, 2)


def test_draft_count_follows_the_timed_cost_of_rows():
    """Where a 2-row step costs a tenth more than a 1-row one and a 5-row step half as much again (near the AVX2
    kernels at a 0.5B model), a sequence of low acceptance drafts 1 token, one of high acceptance 4, one of almost
    none nothing."""
    from rtp_llm.spec_decode import NgramProposer, Speculator
    from rtp_llm.spec_decode.speculator import _COST_PRIOR, StepCost

    cost = StepCost()
    assert cost.relative(1, 3) == 1 + 3 * _COST_PRIOR
    for rows, t in ((1, 0.070), (2, 0.080), (5, 0.105), (1, 0.080)):
        cost.observe(rows, t)
    assert cost.seconds[1] == 0.8 * 0.070 + 0.2 * 0.080
    assert cost.relative(1, 4) == 0.105 / cost.seconds[1]
    # 3 rows never timed: scaled from 2 rows' time
    assert cost.relative(1, 2) == pytest.approx(0.080 * (1 + 3 * _COST_PRIOR) / (1 + 2 * _COST_PRIOR) / 0.072)
    cfg = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4})
    spec = Speculator(cfg, NgramProposer(5, 5), max_model_len=64)
    spec.cost = cost
    (low, high) = _seqs(2, [1])
    low.spec_record, high.spec_record = (0.3, 0.7), (0.9, 0.1)
    assert spec.best_k(low, 4) == 1 and spec.best_k(high, 4) == 4
    low.spec_record = (0.02, 0.98)
    assert spec.best_k(low, 4) == 0
    # a proposer as slow per drafted position as a plain step (a draft model as large as the target) never pays
    cost.observe_drafting(4, 4 * 0.072)
    assert cost.relative(1, 4) == (0.105 + 4 * 0.072) / cost.seconds[1]
    assert spec.best_k(high, 4) == 0




def test_draft_model_reads_the_prompt_with_the_target(tiny, drafts):
    """The step that samples a request's first token runs the draft over its prompt first (time to first token), so
    its first decode step drafts at once."""
    spec = {"method": "draft_model", "model": drafts["same"], "num_speculative_tokens": 3}
    engine = tiny.engine(speculative_config=spec)
    prompt = repetitive(random.Random(9), 40)
    engine.add_request("r", prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    while not engine.step():
        pass
    (seq,) = engine.requests["r"].sequences
    assert len(seq.output) == 1
    assert engine.speculator.proposer.manager.num_slots(seq.seq_id) == len(prompt)
    engine.step()
    assert engine.stats()["spec_decode_num_drafts"] == 1
