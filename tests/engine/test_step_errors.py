"""A step that fails in an operator: the request whose input causes it ends with an error naming the request, the
layer and the operator, then the device's message; the other requests of that batch run on and give transformers'
tokens; no KV block is left behind."""

import pytest

from rtp_llm.engine.step_errors import describe
from rtp_llm.sampling import SamplingParams
from tests.engine.helpers import Tiny, run_all

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
