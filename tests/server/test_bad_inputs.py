"""Bad input gets a 4xx with an OpenAI-style error body, never a 5xx or a hang."""

import json

import httpx
import pytest

from tests.server.server_process import ServerProcess

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]

CASES = [
    (CHAT, {"messages": MSG, "max_tokens": "ten"}, 400),
    (CHAT, {"messages": MSG, "max_tokens": -1}, 400),
    (CHAT, {"messages": MSG, "temperature": -0.5}, 400),
    (CHAT, {"messages": MSG, "temperature": "hot"}, 400),
    (CHAT, {"messages": MSG, "top_p": 0}, 400),
    (CHAT, {"messages": []}, 400),
    (CHAT, {"messages": [{"role": "bad role!", "content": "hi"}]}, 400),
    (CHAT, {"messages": "hi"}, 400),
    (CHAT, {}, 400),
    (CHAT, {"messages": MSG, "n": 100000}, 400),
    (CHAT, {"messages": MSG, "top_logprobs": 3}, 400),
    (CHAT, {"messages": MSG, "stop": ["a"] * 50}, 400),
    (CHAT, {"messages": MSG, "model": "not-this-one"}, 404),
    (CMPL, {"prompt": "x", "max_tokens": 0}, 400),
    (CMPL, {"prompt": []}, 400),
    (CMPL, {"prompt": [[]]}, 400),
    (CMPL, {"prompt": [10**9]}, 400),
    (CMPL, {"prompt": "x" * 3000, "max_tokens": 1}, 400),   # over max_model_len (512)
    (CMPL, {"prompt": "x", "max_tokens": 100000}, 400),
    (CMPL, {"prompt": "x", "suffix": "y"}, 400),
    (CMPL, {"prompt": "x", "seed": -1}, 400),
    (CMPL, {"prompt": "x", "presence_penalty": 5}, 400),
    ("/", {"prompt": "x", "generate_config": {"max_new_tokens": -3}}, 400),
    ("/", {"prompt": 5}, 400),
    ("/", {"generate_config": {}}, 400),
    ("/tokenize", {}, 400),
    ("/detokenize", {"tokens": [-1]}, 400),
]


@pytest.fixture(scope="module")
def small():
    srv = ServerProcess("--max_model_len", "512", "--kv_cache_memory_gb", "0.1", "--max_body_bytes", "100000")
    yield srv
    assert srv.stop() == 0


@pytest.mark.parametrize("path,body,status", CASES)
def test_bad_body_gets_4xx_with_error_body(small, path, body, status):
    r = httpx.post(small.url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and "code" in err and "param" in err


# Fields this server does not implement, at the top level and nested, on every route that takes a body: refused
# with a 400 that names the field (its path for nested ones), never accepted and dropped.
UNIMPLEMENTED = [
    (CHAT, {"messages": MSG, "prediction": {"type": "content", "content": "x"}}, "prediction"),
    (CHAT, {"messages": MSG, "response_format": {"type": "json_object", "strict": True}}, "response_format.strict"),
    (CHAT, {"messages": [{"role": "user", "content": "hi", "input_audio": {"data": "", "format": "wav"}}]},
     "messages.0.input_audio"),
    (CHAT, {"messages": MSG, "stream": True, "stream_options": {"include_usage": True, "continuous": True}},
     "stream_options.continuous"),
    (CMPL, {"prompt": "x", "best_of": 2}, "best_of"),
    ("/", {"prompt": "x", "generate_config": {"max_new_tokens": 4, "do_sample": True}}, "generate_config.do_sample"),
    ("/tokenize", {"prompt": "x", "add_bos": True}, "add_bos"),
    ("/detokenize", {"tokens": [1], "skip_special_tokens": True}, "skip_special_tokens"),
]


@pytest.mark.parametrize("path,body,field", UNIMPLEMENTED)
def test_an_unimplemented_field_is_refused_by_name(small, path, body, field):
    r = httpx.post(small.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["code"] == "unsupported_parameter" and field in err["message"]
    assert err["type"] == "invalid_request_error"


def test_invalid_json_and_oversized_body(small):
    r = httpx.post(small.url + CHAT, content=b"{not json", headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(small.url + "/", content=b"{not json", timeout=30)
    assert r.status_code == 400
    r = httpx.post(small.url + CMPL, json={"prompt": "x" * 200000}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_unknown_route_and_method(small):
    assert httpx.get(small.url + "/v1/nothing").status_code == 404
    assert httpx.get(small.url + CHAT).status_code == 405


def test_api_key_guards_every_route_but_health_and_metrics():
    srv = ServerProcess("--max_model_len", "256", "--kv_cache_memory_gb", "0.05", env={"API_KEY": "s3cret"})
    try:
        assert httpx.get(srv.url + "/health").status_code == 200
        httpx.post(srv.url + CMPL, json={"prompt": "my secret prompt", "max_tokens": 2},
                   headers={"Authorization": "Bearer s3cret"}, timeout=30)
        metrics = httpx.get(srv.url + "/metrics")
        assert metrics.status_code == 200 and "secret prompt" not in metrics.text  # scrapers need no key
        for method, path in (("GET", "/v1/models"), ("POST", CHAT), ("POST", "/"), ("POST", "/tokenize")):
            r = httpx.request(method, srv.url + path, json={"messages": MSG}, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            r = httpx.request(method, srv.url + path, json={}, headers={"Authorization": "Bearer wrong"}, timeout=30)
            assert r.status_code == 401
        r = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
    finally:
        assert srv.stop() == 0


def test_full_queue_gets_503():
    srv = ServerProcess("--max_model_len", "256", "--kv_cache_memory_gb", "0.05", "--max_num_seqs", "1",
                        "--max_queue_len", "1")
    try:
        import asyncio

        async def flood():
            async with httpx.AsyncClient(timeout=120) as http:
                body = {"prompt": "tell me", "max_tokens": 40, "ignore_eos": True}
                return await asyncio.gather(*(http.post(srv.url + CMPL, json=body) for _ in range(8)))

        codes = sorted(r.status_code for r in asyncio.run(flood()))
        assert 200 in codes and 503 in codes and set(codes) <= {200, 503}
    finally:
        assert srv.stop() == 0


# Fields that name token ids or words: a bad value is a 400 whose param is that field (not "prompt"), on both routes,
# and nothing is half-applied (an empty bad word would otherwise ban the space token).
TOKEN_FIELDS = [
    ({"logit_bias": {"999999": 1}}, "logit_bias", "outside the vocabulary"),
    ({"logit_bias": {"-1": 1}}, "logit_bias", "outside the vocabulary"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {"five": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"5": 1, "05": 2}}, "logit_bias", "twice"),
    ({"allowed_token_ids": [3, 70000]}, "allowed_token_ids", "outside the vocabulary"),
    ({"allowed_token_ids": []}, "allowed_token_ids", ""),
    ({"stop_token_ids": [123456]}, "stop_token_ids", "outside the vocabulary"),
    ({"bad_words": [""]}, "bad_words", "not a word"),
    ({"bad_words": ["   "]}, "bad_words", "not a word"),
]


@pytest.mark.parametrize("path", [CHAT, CMPL])
@pytest.mark.parametrize("extra,field,words", TOKEN_FIELDS)
def test_a_bad_token_field_is_a_400_naming_it(small, path, extra, field, words):
    body = {"messages": MSG} if path == CHAT else {"prompt": "hi"}
    r = httpx.post(small.url + path, json={**body, "max_tokens": 2, **extra}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and words in err["message"], err


@pytest.mark.parametrize("path,body,param", [
    (CHAT, {"messages": [{"role": "user", "content": "a\u0000b\udcff"}]}, "messages.0.content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages.0.content.0.text"),
    (CMPL, {"prompt": ["fine", "x\udfff"]}, "prompt.1"),
    ("/", {"prompt": "\udcff"}, "prompt"),
    ("/tokenize", {"prompt": "ok\udcffok"}, "prompt"),
])
def test_a_lone_surrogate_is_a_400_naming_its_field(small, path, body, param):
    """Valid JSON (json.dumps escapes the surrogate), not valid text: it was a 500 (TypeError in the tokenizer)."""
    r = httpx.post(small.url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "invalid_text" and "surrogate" in err["message"]
    ok = httpx.post(small.url + CHAT, json={"messages": [{"role": "user", "content": "a\u0000b"}], "max_tokens": 2},
                    timeout=30)
    assert ok.status_code == 200  # NUL is text: accepted
