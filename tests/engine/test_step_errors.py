"""A step that fails in an operator: the request whose input causes it ends with an error naming the request, the
layer and the operator, then the device's message; the other requests of that batch run on and give transformers'
tokens (under speculative decoding too, rerun alone with their drafts); no KV block is left behind."""

import random

import pytest

from rtp_llm.engine.step_errors import describe
from rtp_llm.sampling import SamplingParams
from tests.engine.helpers import Tiny, repetitive, run_all

POISON = 37  # a sequence of exactly this many tokens of KV makes the injected operator fail


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp("tiny"))


def poison_attention(engine):
    """The attention operator fails when a sequence of the batch holds POISON tokens of KV (what a request's own
    input can do to a real kernel: a shape it refuses)."""
    attn = engine.runner.attn
    real = attn.forward

    def forward(q, k, v, layer_kv, meta):
        if POISON in getattr(meta, "kv_lens_host", []):
            raise RuntimeError("injected: EZ9999 the kernel refused a sequence of 37 tokens")
        return real(q, k, v, layer_kv, meta)

    real_prepare = attn.prepare

    def prepare(batch):
        meta = real_prepare(batch)
        meta.kv_lens_host = list(batch.kv_lens)
        return meta

    attn.forward, attn.prepare = forward, prepare


def test_the_failing_request_gets_the_layered_error_and_the_others_finish(tiny):
    engine = tiny.engine()
    poison_attention(engine)
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = {"ok-a": list(range(10, 30)), "bad": list(range(40, 40 + POISON)), "ok-b": list(range(60, 71))}
    outs = run_all(engine, [(0, rid, p, greedy) for rid, p in prompts.items()])
    bad = outs["bad"].outputs[0]
    assert bad.finish_reason == "error"
    msg = outs["bad"].error
    assert msg.startswith("step of request bad failed in layer 0, operator attn.forward")
    assert "device: RuntimeError: injected: EZ9999 the kernel refused a sequence of 37 tokens" in msg
    for rid in ("ok-a", "ok-b"):  # in the same batch as the failure, they finish with the reference's tokens
        assert outs[rid].outputs[0].finish_reason == "length"
        assert outs[rid].outputs[0].token_ids == tiny.greedy(prompts[rid], 6)
    assert engine.stats()["kv_used_blocks"] == 0


def test_a_known_cause_is_said_in_the_users_terms():
    try:
        raise RuntimeError("npu_fused_infer_attention_score: When layout is TND, inputDataType should be bf16 "
                           "(query is torch.float16)")
    except RuntimeError as exc:
        msg = describe(exc, ["r1", "r2"])
    assert msg.startswith("step of requests r1, r2 failed")
    assert "CANN accepts bfloat16 only" in msg and "device: RuntimeError: npu_fused_infer_attention_score" in msg


def test_under_speculation_the_others_rerun_alone_with_their_drafts(tiny):
    # n-gram drafts on every step; the poison now fires for any sequence holding 37..43 tokens of KV, which only the
    # bad request passes through (the others start above it), whatever number of drafts it takes per step
    engine = tiny.engine(speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                             "prompt_lookup_max": 3, "disable_by_batch_size": 64})
    attn = engine.runner.attn
    real_forward, real_prepare = attn.forward, attn.prepare
    failed_steps = []

    def prepare(batch):
        meta = real_prepare(batch)
        meta.kv_lens_host = list(batch.kv_lens)
        return meta

    def forward(q, k, v, layer_kv, meta):
        if any(37 <= n < 44 for n in meta.kv_lens_host):
            failed_steps.append((q.shape[0], len(meta.kv_lens_host)))
            raise RuntimeError("injected: the kernel refused the sequence")
        return real_forward(q, k, v, layer_kv, meta)

    attn.forward, attn.prepare = forward, prepare
    # the others' greedy continuations fall into loops that their n-grams predict (test_speculative's prompts)
    prompts = {"ok-a": repetitive(random.Random(2), 50), "bad": list(range(100, 133)),
               "ok-b": repetitive(random.Random(7), 48)}
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = run_all(engine, [(0, rid, p, greedy) for rid, p in prompts.items()])
    assert outs["bad"].outputs[0].finish_reason == "error"
    assert outs["bad"].error.startswith("step of request bad failed in layer 0, operator attn.forward")
    for rid in ("ok-a", "ok-b"):  # rerun alone with their drafts, they finish with the reference's tokens
        assert outs[rid].outputs[0].finish_reason == "length"
        assert outs[rid].outputs[0].token_ids == tiny.greedy(prompts[rid], 12)
    # the step that failed held all three and verified drafts (more query rows than sequences); the bad request
    # then failed again alone
    rows, seqs = failed_steps[0]
    assert seqs == 3 and rows > seqs + 1 and [n for _, n in failed_steps[1:]] == [1]
    assert engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert engine.stats()["kv_used_blocks"] == 0
