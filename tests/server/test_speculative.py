"""Speculative decoding through the OpenAI API on a real server (the embedded SmolLM2, float32): answers, logprobs
and streams are the same as a server without speculation; vLLM's spec-decode metrics count the drafts."""

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rtp_llm.models.default_model import SERVED_NAME
from tests.server.conftest import COMMON
from tests.server.server_process import ServerProcess

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4})
SOURCE = "\n".join(f"def handler_{i}(request):\n    return respond(request, code={200 + i})" for i in range(8))
COPY = [{"role": "user", "content": "Copy this code exactly, nothing else:\n\n" + SOURCE}]


@pytest.fixture(scope="module")
def spec_server():
    srv = ServerProcess(*COMMON, "--speculative_config", SPEC)
    yield srv
    assert srv.stop() == 0, srv.output()[-3000:]


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x")


def _answer(srv, **kw):
    r = _client(srv).chat.completions.create(model=SERVED_NAME, messages=COPY, max_tokens=80, logprobs=True,
                                             top_logprobs=2, **kw)
    c = r.choices[0]
    return c.message.content, c.finish_reason, [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs])
                                                for t in c.logprobs.content]


def _spec_metrics(srv) -> dict:
    text = httpx.get(srv.url + "/metrics", timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("vllm:spec_decode")}


def test_answers_are_those_of_a_server_without_speculation(server, spec_server):
    before = _spec_metrics(spec_server)
    for kw in ({"temperature": 0}, {"temperature": 0.8, "seed": 4, "presence_penalty": 0.3}):
        plain = _answer(server, **kw)
        assert _answer(spec_server, **kw) == plain, kw
    after = _spec_metrics(spec_server)
    accepted = "vllm:spec_decode_num_accepted_tokens_total"
    assert after[accepted] > before.get(accepted, 0)
    assert after["vllm:spec_decode_num_draft_tokens_total"] >= after["vllm:spec_decode_num_accepted_tokens_total"]
    assert after["vllm:spec_decode_num_drafts_total"] > 0


def test_stream_and_stop_string_under_speculation(server, spec_server):
    content, _, _ = _answer(server, temperature=0)
    stop = content[len(content) // 2:len(content) // 2 + 6]
    plain = _client(server).chat.completions.create(model=SERVED_NAME, messages=COPY, max_tokens=80, temperature=0,
                                                    stop=[stop])
    chunks = _client(spec_server).chat.completions.create(model=SERVED_NAME, messages=COPY, max_tokens=80,
                                                          temperature=0, stop=[stop], stream=True)
    pieces, reasons = [], []
    for ch in chunks:
        if ch.choices:
            pieces.append(ch.choices[0].delta.content or "")
            reasons.append(ch.choices[0].finish_reason)
    assert "".join(pieces) == plain.choices[0].message.content
    assert reasons[-1] == plain.choices[0].finish_reason == "stop"
