"""The serving engine on a tiny random model: continuous batching, chunked prefill, prefix caching,
preemption, aborts, stop conditions, n > 1, seeds. Greedy outputs are checked against transformers."""

import random

import pytest

from rtp_llm.errors import QueueFullError, RequestRejected
from rtp_llm.sampling import SamplingParams
from tests.engine.helpers import Tiny, greedy, run_all

PROMPTS = [[(i * 7 + k * 13) % 250 + 3 for i in range(length)] for k, length in enumerate([3, 11, 40, 17, 1, 29])]
MAX_TOKENS = [12, 24, 8, 20, 16, 10]
ARRIVALS = [0, 0, 2, 3, 5, 9]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp("tiny"))


def _staggered(tiny, **engine_args):
    engine = tiny.engine(**engine_args)
    arrivals = [(ARRIVALS[i], f"r{i}", PROMPTS[i], greedy(MAX_TOKENS[i])) for i in range(len(PROMPTS))]
    return engine, run_all(engine, arrivals)


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_staggered_requests_match_transformers(tiny, prefix_caching, chunk):
    engine, done = _staggered(tiny, enable_prefix_caching=prefix_caching, max_prefill_chunk=chunk)
    for i, prompt in enumerate(PROMPTS):
        out = done[f"r{i}"].outputs[0]
        assert out.token_ids == tiny.greedy(prompt, MAX_TOKENS[i]), f"request {i}"
        assert out.finish_reason == "length"
    assert engine.stats()["kv_used_blocks"] == 0


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_under_a_small_pool_loses_nothing(tiny, prefix_caching):
    # 21 usable blocks of 4 tokens: the largest request needs 12, all together ~60.
    engine, done = _staggered(tiny, num_blocks=22, max_model_len=64, enable_prefix_caching=prefix_caching,
                              max_prefill_chunk=16)
    assert engine.scheduler.num_preemptions > 0
    for i, prompt in enumerate(PROMPTS):
        assert done[f"r{i}"].outputs[0].token_ids == tiny.greedy(prompt, MAX_TOKENS[i])
    s = engine.stats()
    assert s["kv_used_blocks"] == 0 and s["running"] == 0 and s["waiting"] == 0


def test_each_request_alone_gives_the_same_tokens(tiny):
    _, together = _staggered(tiny)
    for i, prompt in enumerate(PROMPTS):
        alone = run_all(tiny.engine(), [(0, "a", prompt, greedy(MAX_TOKENS[i]))])["a"]
        assert alone.outputs[0].token_ids == together[f"r{i}"].outputs[0].token_ids


def test_shared_three_block_prefix_computes_only_the_suffix(tiny):
    engine = tiny.engine(block_size=4)
    shared = PROMPTS[2][:12]  # 3 blocks
    first = run_all(engine, [(0, "a", shared + [5, 6, 7], greedy(4))])
    assert first["a"].num_cached_tokens == 0
    second_prompt = shared + [9, 10]
    out = run_all(engine, [(0, "b", second_prompt, greedy(10))])["b"]
    assert out.num_cached_tokens == 12
    assert out.metrics["computed_prompt_tokens"] == len(second_prompt) - 12
    assert out.outputs[0].token_ids == tiny.greedy(second_prompt, 10)
    assert engine.stats()["prefix_hit_tokens"] >= 12


def test_abort_mid_generation_returns_every_block(tiny):
    engine = tiny.engine(enable_prefix_caching=False)
    engine.add_request("x", PROMPTS[2], greedy(50))
    engine.add_request("y", PROMPTS[1], greedy(50))
    for _ in range(5):
        engine.step()
    assert engine.stats()["kv_used_blocks"] > 0
    assert engine.abort("x")
    outs = engine.step()
    aborted = [o for o in outs if o.request_id == "x"]
    assert aborted and aborted[0].finished and aborted[0].outputs[0].finish_reason == "abort"
    engine.abort("y")
    engine.step()
    assert engine.stats()["kv_used_blocks"] == 0 and not engine.has_unfinished()
    assert not engine.abort("x")  # unknown now


def test_thousand_random_requests_with_aborts_leak_nothing(tiny):
    rng = random.Random(7)
    engine = tiny.engine(num_blocks=48, max_model_len=96, max_num_seqs=8, max_prefill_chunk=8)
    total = engine.scheduler.manager.stats().total_blocks
    added, live, finished = 0, set(), 0
    while added < 1000 or engine.has_unfinished():
        for _ in range(rng.randint(0, 3)):
            if added >= 1000:
                break
            n = rng.choice([1, 1, 1, 2, 3])
            params = SamplingParams(max_tokens=rng.randint(1, 12), temperature=rng.choice([0, 0.7, 1.3]),
                                    top_k=rng.choice([0, 5]), top_p=rng.choice([1.0, 0.9]), n=n,
                                    seed=rng.choice([None, rng.randint(0, 99)]), min_tokens=rng.choice([0, 1]),
                                    repetition_penalty=rng.choice([1.0, 1.2]), stop=rng.choice([[], ["e"]]))
            prompt = [rng.randint(3, 250) for _ in range(rng.randint(1, 40))]
            rid = f"q{added}"
            engine.add_request(rid, prompt, params)
            live.add(rid)
            added += 1
        if live and rng.random() < 0.15:
            victim = rng.choice(sorted(live))
            engine.abort(victim)
        for out in engine.step():
            if out.finished:
                live.discard(out.request_id)
                finished += 1
    s = engine.scheduler.manager.stats()
    assert s.used_blocks == 0 and s.num_sequences == 0
    assert s.free_blocks + s.cached_blocks == total
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting
    assert finished == 1000


def test_stop_string_across_tokens_is_not_emitted(tiny):
    prompt = PROMPTS[3]
    full = run_all(tiny.engine(), [(0, "a", prompt, greedy(24))])["a"].outputs[0]
    text = full.text
    # A stop string that spans a token boundary somewhere in the middle of the text.
    pieces = [tiny.tokenizer.decode(full.token_ids[:k]) for k in range(len(full.token_ids) + 1)]
    k = next(k for k in range(3, len(pieces)) if len(pieces[k]) > len(pieces[k - 1]) >= 2 and len(pieces[k]) >= 6)
    boundary = len(pieces[k - 1])
    stop = text[boundary - 1: boundary + 1]
    first = text.find(stop)
    out = run_all(tiny.engine(), [(0, "b", prompt, greedy(24, stop=[stop]))])["b"].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[:first]
    assert stop not in out.text


def test_streamed_deltas_concatenate_to_the_text_and_hold_back_stop_prefixes(tiny):
    prompt = PROMPTS[3]
    full = run_all(tiny.engine(), [(0, "a", prompt, greedy(24))])["a"].outputs[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    engine = tiny.engine()
    engine.add_request("s", prompt, greedy(24, stop=[stop]))
    streamed, final = "", None
    while engine.has_unfinished():
        for out in engine.step():
            streamed += out.outputs[0].delta_text
            final = out
    assert streamed == final.outputs[0].text == full[: full.find(stop)]


def test_min_tokens_and_stop_token_ids(tiny):
    prompt = PROMPTS[1]
    ref = tiny.greedy(prompt, 20)
    banned = ref[0]
    out = run_all(tiny.engine(), [(0, "a", prompt, greedy(20, stop_token_ids=[banned]))])["a"].outputs[0]
    assert out.token_ids == [banned] and out.finish_reason == "stop" and out.stop_reason == banned
    out = run_all(tiny.engine(), [(0, "b", prompt, greedy(20, stop_token_ids=[banned], min_tokens=3))])["b"].outputs[0]
    assert banned not in out.token_ids[:3]
    assert len(out.token_ids) >= 3
    if out.finish_reason == "stop":
        assert out.token_ids[-1] == banned and banned not in out.token_ids[:-1]


def test_eos_stops_unless_ignored(tiny):
    prompt = PROMPTS[0]
    ref = tiny.greedy(prompt, 16)
    eos = ref[4]
    first = ref.index(eos)
    stopped = run_all(tiny.engine(eos_token_ids=[eos]), [(0, "a", prompt, SamplingParams(max_tokens=16, temperature=0))])
    assert stopped["a"].outputs[0].token_ids == ref[: first + 1]
    assert stopped["a"].outputs[0].finish_reason == "stop"
    ignored = run_all(tiny.engine(eos_token_ids=[eos]), [(0, "b", prompt, greedy(16))])
    assert ignored["b"].outputs[0].token_ids == ref
    assert ignored["b"].outputs[0].finish_reason == "length"


def test_n_samples_fork_and_share_prompt_blocks(tiny):
    engine = tiny.engine(block_size=4, enable_prefix_caching=False)
    prompt = PROMPTS[2][:18]  # 4 full blocks + a partial one
    engine.add_request("n", prompt, SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=5))
    engine.step()  # the whole prompt is computed once, then forked
    seqs = engine.requests["n"].sequences
    tables = [engine.scheduler.manager.block_table(s.seq_id) for s in seqs]
    assert tables[0][:4] == tables[1][:4] == tables[2][:4]
    assert all(engine.scheduler.manager.ref_count(b) == 3 for b in tables[0][:4])
    assert engine.stats()["prompt_tokens"] == len(prompt)  # computed once, not three times
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    texts = [o.token_ids for o in done["n"].outputs]
    assert len(texts) == 3 and len({tuple(t) for t in texts}) > 1
    assert engine.stats()["kv_used_blocks"] == 0
    # Greedy n=3: every sample is the greedy continuation.
    out = run_all(tiny.engine(), [(0, "g", prompt, greedy(6, n=3))])["g"]
    assert [o.token_ids for o in out.outputs] == [tiny.greedy(prompt, 6)] * 3


def test_seeded_sampling_does_not_depend_on_batch_composition(tiny):
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    alone = run_all(tiny.engine(), [(0, "s", PROMPTS[1], params)])["s"].outputs[0].token_ids
    crowd = [(0, f"o{i}", PROMPTS[i], SamplingParams(max_tokens=8, temperature=0.9)) for i in (0, 2, 3)]
    crowd += [(1, "s", PROMPTS[1], params), (2, "late", PROMPTS[4], greedy(5))]
    together = run_all(tiny.engine(max_prefill_chunk=5), crowd)["s"].outputs[0].token_ids
    assert together == alone


def test_requests_that_can_never_fit_are_refused(tiny):
    engine = tiny.engine(max_model_len=64, num_blocks=17, block_size=4)  # 64 tokens of KV
    with pytest.raises(RequestRejected, match="max_model_len"):
        engine.add_request("a", list(range(3, 60)), greedy(10))
    with pytest.raises(RequestRejected, match="KV blocks"):  # fits max_model_len, but not 3 samples of it
        engine.add_request("b", list(range(3, 30)), greedy(30, n=3))
    with pytest.raises(ValueError, match="less than max_model_len"):
        tiny.engine(max_model_len=64, num_blocks=10, block_size=4)
    with pytest.raises(RequestRejected, match="empty"):
        engine.add_request("c", [], greedy(1))
    with pytest.raises(RequestRejected, match="vocabulary"):
        engine.add_request("d", [1, 99999], greedy(1))
    engine.add_request("e", [5, 6], greedy(1))
    with pytest.raises(RequestRejected, match="already in use"):
        engine.add_request("e", [5, 6], greedy(1))
    full = tiny.engine(max_queue_len=2)
    full.add_request("1", [5], greedy(1))
    full.add_request("2", [5], greedy(1))
    with pytest.raises(QueueFullError):
        full.add_request("3", [5], greedy(1))


def test_timeout_aborts_the_request(tiny):
    import time

    engine = tiny.engine()
    engine.add_request("t", PROMPTS[0], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True, timeout_ms=20))
    engine.step()
    time.sleep(0.05)
    outs = [o for o in engine.step() if o.request_id == "t"]
    assert outs and outs[0].finished and outs[0].outputs[0].finish_reason == "abort"
    assert "timed out" in outs[0].error
    assert engine.stats()["kv_used_blocks"] == 0 and not engine.has_unfinished()


def test_min_tokens_holds_back_eos_even_with_ignore_eos(tiny):
    """vLLM's rule: min_tokens bans EOS (and the stop ids) for its first tokens whatever ignore_eos says."""
    prompt = PROMPTS[0]
    eos = tiny.greedy(prompt, 1)[0]  # the model's first choice is its EOS
    plain = SamplingParams(max_tokens=8, temperature=0, min_tokens=4)
    out = run_all(tiny.engine(eos_token_ids=[eos]), [(0, "a", prompt, plain)])["a"].outputs[0]
    assert eos not in out.token_ids[:4] and len(out.token_ids) >= 4
    out = run_all(tiny.engine(eos_token_ids=[eos]), [(0, "b", prompt, greedy(8, min_tokens=4))])  # ignore_eos
    tokens = out["b"].outputs[0].token_ids
    assert eos not in tokens[:4] and len(tokens) == 8


def hf_greedy_with(tiny, prompt, n, **generate_kwargs):
    """transformers' greedy continuation under its own logits processors (sequence_bias, bad_words_ids, ...)."""
    import torch

    with torch.no_grad():
        out = tiny.hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                               **generate_kwargs)
    return out[0, len(prompt):].tolist()


def test_logit_bias_matches_transformers_sequence_bias(tiny):
    prompt = PROMPTS[3]
    ref = tiny.greedy(prompt, 12)
    bias = {ref[0]: -100.0, ref[2]: -3.5, 77: 2.25}
    expected = hf_greedy_with(tiny, prompt, 12, sequence_bias={(t,): b for t, b in bias.items()})
    assert expected != ref  # the bias changes the answer
    got = run_all(tiny.engine(), [(0, "a", prompt, greedy(12, logit_bias=bias))])["a"].outputs[0].token_ids
    assert got == expected
    forced = run_all(tiny.engine(), [(0, "b", prompt, greedy(5, logit_bias={123: 100.0}))])["b"].outputs[0]
    assert forced.token_ids == [123] * 5


def test_repetition_penalty_matches_transformers_alone_and_in_a_batch(tiny):
    """The penalty reads the sequence's counts as the runner keeps them step by step (and a sibling batch row's
    counts never leak in): greedy tokens equal transformers' generate with the same penalty."""
    prompt = PROMPTS[1]
    expected = hf_greedy_with(tiny, prompt, 16, repetition_penalty=1.8)
    assert expected != tiny.greedy(prompt, 16)  # the penalty changes the answer
    alone = run_all(tiny.engine(), [(0, "a", prompt, greedy(16, repetition_penalty=1.8))])["a"].outputs[0]
    assert alone.token_ids == expected
    batch = run_all(tiny.engine(max_prefill_chunk=5), [
        (0, "other", PROMPTS[2], greedy(20, repetition_penalty=1.3, frequency_penalty=0.5)),
        (2, "a", prompt, greedy(16, repetition_penalty=1.8)),
        (3, "plain", PROMPTS[3], greedy(10))])
    assert batch["a"].outputs[0].token_ids == expected


def test_bad_words_match_transformers_bad_words_ids(tiny):
    prompt = PROMPTS[2]
    ref = tiny.greedy(prompt, 12)
    words = [[ref[1]], [ref[4], ref[5]]]  # a one-token word, and a two-token word the model would write
    expected = hf_greedy_with(tiny, prompt, 12, bad_words_ids=words)
    assert expected != ref
    params = greedy(12)
    params.bad_words_token_ids = words  # what the input processor makes of bad_words strings
    got = run_all(tiny.engine(), [(0, "a", prompt, params)])["a"].outputs[0].token_ids
    assert got == expected


def test_allowed_token_ids_restrict_every_sample(tiny):
    allowed = [5, 17, 99, 200]
    outs = run_all(tiny.engine(), [(0, f"s{i}", PROMPTS[i % 6], SamplingParams(
        max_tokens=10, temperature=1.5, seed=i, ignore_eos=True, allowed_token_ids=allowed)) for i in range(6)])
    seen = {t for o in outs.values() for t in o.outputs[0].token_ids}
    assert seen <= set(allowed) and len(seen) >= 3
    ref = tiny.greedy(PROMPTS[0], 6)
    only = [t for t in range(256) if t != ref[0]][:50]
    out = run_all(tiny.engine(), [(0, "g", PROMPTS[0], greedy(6, allowed_token_ids=only))])["g"].outputs[0]
    assert set(out.token_ids) <= set(only)
    expected = hf_greedy_with(tiny, PROMPTS[0], 6, prefix_allowed_tokens_fn=lambda b, ids: only)
    assert out.token_ids == expected


def test_token_ids_outside_the_vocabulary_are_refused(tiny):
    eng = tiny.engine()
    for params in (greedy(4, logit_bias={999999: 1.0}), greedy(4, allowed_token_ids=[3, 70000])):
        with pytest.raises(RequestRejected, match="outside the vocabulary"):
            eng.add_request("x", PROMPTS[0], params)
    with pytest.raises(ValueError, match=r"logit_bias values must be in \[-100, 100\]"):
        greedy(4, logit_bias={3: 101.0})


def test_the_runner_frees_the_sampling_rows_of_finished_requests(tiny):
    """The persistent input batch holds a row for each sequence that sampled until the scheduler reports it finished
    (length, abort, n > 1 siblings), which it does with the next step that runs."""
    engine = tiny.engine(max_num_seqs=3)
    done = run_all(engine, [(k, f"r{k}", PROMPTS[k], SamplingParams(max_tokens=5 + k, temperature=0.8, seed=k, n=2)
                             if k % 2 else greedy(4 + k, logprobs=2)) for k in range(6)])
    rows = engine.runner.input_batch
    left = set(rows.slots)  # those that finished at the last step
    assert len(done) == 6 and 1 <= len(left) <= 3 and all(s.finished for s in left)
    engine.add_request("late", PROMPTS[0], greedy(50, logprobs=1))
    for _ in range(3):
        engine.step()
    late = next(iter(rows.slots))
    assert len(rows) == 1 and late.request.request_id == "late"
    engine.abort("late")
    engine.step()  # nothing runs: the aborted row waits for the next step that does
    assert late in rows
    run_all(engine, [(0, "after", PROMPTS[1], greedy(2, logprobs=0))])
    assert late not in rows and len(rows) == 1
