"""OpenAI compatibility details a client test suite checks (issue 24), through raw HTTP and the openai client
against a real server on the embedded model."""

import json
import time

import httpx
import openai
import pytest

from rtp_llm.models.default_model import SERVED_NAME


def sse(server, path, body):
    """The data events of a stream, parsed (without [DONE])."""
    out = []
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_each_streamed_choice_ends_exactly_once(server, path):
    """n = 3 with choices ending at different steps: a choice that ends early is not ended again on every later
    step (it was: 30 finish chunks for one index)."""
    body = {"max_tokens": 30, "n": 3, "temperature": 1.0, "seed": 11, "stream": True, "stop": ["."]}
    body.update({"prompt": "Once upon a time"} if "chat" not in path else
                {"messages": [{"role": "user", "content": "Tell me a story."}]})
    events = sse(server, path, body)
    ends = {}
    for step, e in enumerate(events):
        for c in e["choices"]:
            if c["finish_reason"] is not None:
                ends.setdefault(c["index"], []).append(step)
    assert sorted(ends) == [0, 1, 2] and all(len(v) == 1 for v in ends.values()), ends
    assert len({v[0] for v in ends.values()}) > 1  # they did end at different steps


def test_first_chat_chunk_is_the_role_alone_and_every_body_has_a_fingerprint(server):
    events = sse(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                                                   "stream": True, "stream_options": {"include_usage": True}})
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in e["choices"][0]["delta"] for e in events[1:] if e["choices"])
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert all("system_fingerprint" in e for e in events)
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/completions", {"prompt": "Hi"})):
        r = httpx.post(server.url + path, json={**body, "max_tokens": 2}, timeout=60)
        assert "system_fingerprint" in r.json()
        assert all("system_fingerprint" in e for e in sse(server, path, {**body, "max_tokens": 2, "stream": True}))


def test_stream_options_without_stream_is_a_400(server):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/completions", {"prompt": "Hi"})):
        r = httpx.post(server.url + path, json={**body, "stream_options": {"include_usage": True}}, timeout=30)
        assert r.status_code == 400 and "stream_options" in r.json()["error"]["message"]


def test_a_base_url_without_v1_gets_a_404_that_says_where_the_routes_are(server):
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)  # forgot /v1
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": "Hi"}])
    assert "/v1/chat/completions" in err.value.body["message"] and "base_url" in err.value.body["message"]
    r = httpx.get(server.url + "/nope", timeout=10)
    assert r.status_code == 404 and "/v1/chat/completions" in r.json()["error"]["message"]


def test_a_non_streaming_client_that_leaves_is_one_log_line_not_a_traceback(server):
    before = server.output()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 400,
                                                         "ignore_eos": True}, timeout=1.5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "disconnected; aborted" not in server.output()[len(before):]:
        time.sleep(0.2)
    new = server.output()[len(before):]
    assert "the client disconnected; aborted" in new
    assert "Traceback" not in new and "CancelledError" not in new and "Exception in ASGI" not in new
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    running = [line for line in metrics.splitlines() if line.startswith("rtp_llm_num_requests_running")]
    assert running and float(running[0].split()[-1]) == 0


# --- vLLM's extensions -----------------------------------------------------------------------------------------
CONV = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def hf_tok():
    from transformers import PreTrainedTokenizerFast

    from rtp_llm.models.default_model import default_model_path
    from rtp_llm.tokenizer import Tokenizer

    tok = Tokenizer.load(default_model_path())
    return PreTrainedTokenizerFast(tokenizer_object=tok.backend), tok.chat_template


def test_return_token_ids_and_tokens_as_ids(server, hf_tok):
    hf, template = hf_tok
    prompt_ids = hf.encode(hf.apply_chat_template(CONV, chat_template=template, tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False)
    body = {"messages": CONV, "max_tokens": 8, "temperature": 0, "return_token_ids": True, "logprobs": True,
            "return_tokens_as_token_ids": True}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    ids = r["choices"][0]["token_ids"]
    assert r["prompt_token_ids"] == prompt_ids and len(ids) == r["usage"]["completion_tokens"]
    assert hf.decode(ids, skip_special_tokens=True) == r["choices"][0]["message"]["content"]
    assert [c["token"] for c in r["choices"][0]["logprobs"]["content"]] == [f"token_id:{i}" for i in ids]
    events = sse(server, "/v1/chat/completions", {**body, "stream": True})
    assert events[0]["prompt_token_ids"] == prompt_ids
    assert [i for e in events for c in e["choices"] for i in c.get("token_ids", [])] == ids
    c = httpx.post(server.url + "/v1/completions", json={"prompt": "The sky is", "max_tokens": 6, "temperature": 0,
                                                         "return_token_ids": True}, timeout=60).json()["choices"][0]
    assert c["prompt_token_ids"] == hf.encode("The sky is") and hf.decode(c["token_ids"]) == c["text"]
    streamed = sse(server, "/v1/completions", {"prompt": "The sky is", "max_tokens": 6, "temperature": 0,
                                               "return_token_ids": True, "stream": True})
    assert streamed[0]["choices"][0]["prompt_token_ids"] == c["prompt_token_ids"]
    assert [i for e in streamed for i in e["choices"][0]["token_ids"]] == c["token_ids"]


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {"messages": CONV}),
                                       ("/v1/completions", {"prompt": "Once upon a time", "n": 2})])
def test_continuous_usage_stats(server, path, body):
    events = sse(server, path, {**body, "max_tokens": 12, "stream": True, "temperature": 0, "ignore_eos": True,
                                "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == events[-1]["usage"]["completion_tokens"]
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]
               for e in events)
    assert counts[-1] == 12 * body.get("n", 1)


def test_custom_roles_and_continue_final_message_render_as_transformers_does(server, hf_tok):
    hf, template = hf_tok
    custom = [{"role": "wizard", "content": "You speak in riddles."}] + CONV
    r = httpx.post(server.url + "/tokenize", json={"messages": custom}, timeout=30).json()
    ref = hf.apply_chat_template(custom, chat_template=template, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>wizard" in ref and r["tokens"] == hf.encode(ref, add_special_tokens=False)
    started = CONV + [{"role": "assistant", "content": "My favourite color is"}]
    ref = hf.apply_chat_template(started, chat_template=template, tokenize=False, continue_final_message=True)
    body = {"messages": started, "max_tokens": 6, "temperature": 0, "add_generation_prompt": False,
            "continue_final_message": True, "return_token_ids": True}
    out = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert out["prompt_token_ids"] == hf.encode(ref, add_special_tokens=False)
    echoed = httpx.post(server.url + "/v1/chat/completions", json={**body, "echo": True}, timeout=60).json()
    assert echoed["choices"][0]["message"]["content"] == "My favourite color is" + \
        out["choices"][0]["message"]["content"]
    events = sse(server, "/v1/chat/completions", {**body, "echo": True, "stream": True})
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == \
        echoed["choices"][0]["message"]["content"]
    bad = httpx.post(server.url + "/v1/chat/completions", json={**body, "add_generation_prompt": True}, timeout=30)
    assert bad.status_code == 400 and "continue_final_message" in bad.json()["error"]["message"]


def test_tokenize_token_strs_and_llama_cpp_spellings(server, hf_tok):
    hf, _ = hf_tok
    r = httpx.post(server.url + "/tokenize", json={"content": "Hello world", "return_token_strs": True},
                   timeout=30).json()
    assert r["tokens"] == hf.encode("Hello world") and r["token_strs"] == hf.convert_ids_to_tokens(r["tokens"])
    d = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}, timeout=30).json()
    assert d["content"] == d["prompt"] == "Hello world"


def test_vllm_metric_names_carry_the_same_values(server):
    from prometheus_client.parser import text_string_to_metric_families

    httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 3}, timeout=60)
    samples = {s.name + json.dumps(sorted(s.labels.items())): s.value
               for fam in text_string_to_metric_families(httpx.get(server.url + "/metrics", timeout=10).text)
               for s in fam.samples}

    def value(name, **labels):
        labels = {"model_name": SERVED_NAME, **labels}
        return samples[name + json.dumps(sorted(labels.items()))]

    for ours, theirs in (("rtp_llm_num_requests_running", "vllm:num_requests_running"),
                         ("rtp_llm_num_requests_waiting", "vllm:num_requests_waiting"),
                         ("rtp_llm_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc"),
                         ("rtp_llm_prompt_tokens_total", "vllm:prompt_tokens_total"),
                         ("rtp_llm_generation_tokens_total", "vllm:generation_tokens_total"),
                         ("rtp_llm_time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_count"),
                         ("rtp_llm_e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_sum")):
        assert value(ours) == value(theirs), ours
    assert value("vllm:request_success_total", finished_reason="length") == \
        value("rtp_llm_request_success_total", finished_reason="length") >= 1
    assert value("vllm:inter_token_latency_seconds_count") >= 2


def test_cors_preflight_needs_no_key_and_is_off_by_default(server):
    from tests.server.server_process import ServerProcess

    pre = {"origin": "http://app.example", "access-control-request-method": "POST",
           "access-control-request-headers": "authorization, content-type"}
    assert "access-control-allow-origin" not in httpx.options(server.url + "/v1/models", headers=pre).headers
    srv = ServerProcess("--max_model_len", "128", "--kv_cache_memory_gb", "0.05", "--api_key", "k",
                        "--allowed_origins", '["http://app.example"]')
    try:
        r = httpx.options(srv.url + "/v1/chat/completions", headers=pre, timeout=10)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        assert httpx.get(srv.url + "/v1/models", headers={"origin": "http://app.example"}).status_code == 401
        ok = httpx.get(srv.url + "/v1/models", headers={"origin": "http://app.example", "authorization": "Bearer k"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"
    finally:
        assert srv.stop() == 0


def test_completion_top_logprobs_always_hold_the_sampled_token(server):
    """OpenAI's legacy completions: the sampled token's logprob is always among top_logprobs (up to logprobs + 1
    entries), so logprobs=0 gives the chosen token alone (it gave an empty dict per token)."""
    for logprobs, temperature in ((0, 0), (1, 1.5)):
        r = httpx.post(server.url + "/v1/completions", json={
            "prompt": "Once upon a time", "max_tokens": 16, "logprobs": logprobs, "temperature": temperature,
            "seed": 5}, timeout=60).json()
        lp = r["choices"][0]["logprobs"]
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            assert top[token] == value and len(top) <= logprobs + 1
        if logprobs == 0:
            assert all(len(top) == 1 for top in lp["top_logprobs"])
