"""Schema-driven fuzzing of the request bodies in the server's own OpenAPI document: generated
bodies (valid and not) never get a 5xx. Bounded in cases and time."""

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from tests.server.server_process import ServerProcess

ROUTES = ["/v1/chat/completions", "/v1/completions", "/", "/tokenize", "/detokenize"]


@pytest.fixture(scope="module")
def fuzz_server():
    # Short max_model_len: every accepted request finishes within a few dozen tokens.
    srv = ServerProcess("--max_model_len", "48", "--kv_cache_memory_gb", "0.05", "--max_num_seqs", "8")
    yield srv
    assert srv.stop() == 0


def _body_schema(openapi: dict, path: str) -> dict:
    schema = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**schema, "components": openapi["components"]}


@pytest.mark.parametrize("path", ROUTES)
def test_no_5xx(fuzz_server, path):
    openapi = httpx.get(fuzz_server.url + "/openapi.json").json()
    valid = from_schema(_body_schema(openapi, path))
    junk = st.dictionaries(st.sampled_from(["messages", "prompt", "max_tokens", "n", "stream", "temperature",
                                            "generate_config", "tokens", "stop", "logprobs", "seed"]),
                           st.one_of(st.none(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
                                     st.lists(st.integers(-5, 60000), max_size=5), st.booleans()))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(valid, junk))
    def check(body):
        # json.dumps writes NaN/Infinity, which strict JSON parsers must refuse with a 4xx, not crash on.
        r = httpx.post(fuzz_server.url + path, content=json.dumps(body), timeout=120,
                       headers={"content-type": "application/json"})
        assert r.status_code < 500, (body, r.status_code, r.text[:500])
        if r.status_code >= 400:
            assert "error" in r.json()

    check()
    assert httpx.get(fuzz_server.url + "/health").status_code == 200


# Hostile text: lone surrogates (valid JSON escapes, no UTF-8), NUL and control characters, very long tokens, mixed
# scripts and right-to-left marks, long strings within the body limit; in every string slot of every route.
HOSTILE = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
    .map(lambda s: "a" + s + "b"),
    st.text(alphabet=st.characters(max_codepoint=0x1F), min_size=1, max_size=40),
    st.sampled_from(["a\u0000b\udcff", "x" * 5000, "\u202eabc\u200d\ufeff", "汉字 العربية ру́сский 🧪" * 50,
                     "\U0010FFFF\uFFFE\uFFFF", "word " * 20000]),
    st.text(max_size=200),
)
SLOTS = {
    "/v1/chat/completions": [lambda s: {"messages": [{"role": "user", "content": s}], "max_tokens": 2},
                             lambda s: {"messages": [{"role": "user", "content": [{"type": "text", "text": s}]}],
                                        "max_tokens": 2},
                             lambda s: {"messages": [{"role": "user", "content": "hi", "name": s}], "max_tokens": 2},
                             lambda s: {"messages": [{"role": "user", "content": "hi"}], "stop": [s], "max_tokens": 2}],
    "/v1/completions": [lambda s: {"prompt": s, "max_tokens": 2}, lambda s: {"prompt": [s, "ok"], "max_tokens": 2},
                        lambda s: {"prompt": "hi", "bad_words": [s], "max_tokens": 2}],
    "/": [lambda s: {"prompt": s, "generate_config": {"max_new_tokens": 2}},
          lambda s: {"prompt": "hi", "generate_config": {"max_new_tokens": 2, "stop_words_str": [s]}}],
    "/tokenize": [lambda s: {"prompt": s}, lambda s: {"messages": [{"role": "user", "content": s}]}],
}


@pytest.mark.parametrize("path", sorted(SLOTS))
def test_hostile_strings_never_get_a_5xx(fuzz_server, path):
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(SLOTS[path]), HOSTILE)
    def check(make, text):
        r = httpx.post(fuzz_server.url + path, content=json.dumps(make(text)), timeout=120,
                       headers={"content-type": "application/json"})
        assert r.status_code < 500, (path, text[:80], r.status_code, r.text[:300])
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: a 400 that names where it is
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text", r.text[:300]

    check()
    assert httpx.get(fuzz_server.url + "/health").status_code == 200
