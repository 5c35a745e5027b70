"""RTP-LLM's native route, /tokenize, /detokenize, /health and /metrics on a real server."""

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families


def _metrics(url) -> dict:
    text = httpx.get(url + "/metrics", timeout=30).text
    values = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("" if not s.labels.get("finished_reason") else f"[{s.labels['finished_reason']}]")
            values[key] = values.get(key, 0) + s.value
    return values


def test_native_round_trip_plain_and_streamed(server):
    body = {"prompt": "The capital of France is", "generate_config": {"max_new_tokens": 8, "temperature": 0}}
    r = httpx.post(server.url + "/", content=json.dumps(body), timeout=60)  # no JSON content-type, as upstream clients
    assert r.status_code == 200
    out = r.json()
    assert out["finished"] is True and out["aux_info"]["output_len"] == 8
    assert "Paris" in out["response"]
    body["yield_generator"] = True
    events = []
    with httpx.stream("POST", server.url + "/", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["finished"] and events[-1]["response"] == out["response"]
    assert all(not e["finished"] for e in events[:-1])
    # cumulative by default: each event extends the previous one
    assert all(b["response"].startswith(a["response"]) for a, b in zip(events, events[1:]))
    body["generate_config"]["return_incremental"] = True
    with httpx.stream("POST", server.url + "/", json=body, timeout=60) as resp:
        deltas = [json.loads(l[6:])["response"] for l in resp.iter_lines() if l.startswith("data: ")]
    assert "".join(deltas) == out["response"]


def test_native_stop_words_and_return_sequences(server):
    body = {"prompt": "List: apples, pears,", "generate_config": {"max_new_tokens": 16, "temperature": 0}}
    base = httpx.post(server.url + "/", json=body, timeout=60).json()["response"]
    stop = base[3:5]
    body["generate_config"]["stop_words_str"] = [stop]
    assert httpx.post(server.url + "/", json=body, timeout=60).json()["response"] == base[: base.find(stop)]
    body["generate_config"] = {"max_new_tokens": 4, "num_return_sequences": 3, "temperature": 1.0,
                               "random_seed": 1}
    out = httpx.post(server.url + "/", json=body, timeout=60).json()
    assert isinstance(out["response"], list) and len(out["response"]) == 3


def test_tokenize_detokenize(server):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) > 0
    text = httpx.post(server.url + "/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"]
    assert text == "Hello world"
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    rendered = httpx.post(server.url + "/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert rendered.endswith("<|im_start|>assistant\n") and "hi" in rendered


def test_metrics_parse_and_counters_move(server):
    before = _metrics(server.url)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "One two three", "max_tokens": 5,
                                                         "temperature": 0}, timeout=60)
    assert r.status_code == 200
    after = _metrics(server.url)
    assert after["rtp_llm_generation_tokens_total"] - before["rtp_llm_generation_tokens_total"] == 5
    assert after["rtp_llm_prompt_tokens_total"] > before["rtp_llm_prompt_tokens_total"]
    assert after["rtp_llm_request_success_total[length]"] - before.get("rtp_llm_request_success_total[length]", 0) == 1
    assert after["rtp_llm_time_to_first_token_seconds_count"] == before.get(
        "rtp_llm_time_to_first_token_seconds_count", 0) + 1
    assert after["rtp_llm_e2e_request_latency_seconds_count"] > before.get("rtp_llm_e2e_request_latency_seconds_count", 0)
    for name in ("rtp_llm_num_requests_running", "rtp_llm_num_requests_waiting", "rtp_llm_kv_cache_usage_ratio",
                 "rtp_llm_prefix_cache_hit_rate", "rtp_llm_time_per_output_token_seconds_count"):
        assert name in after


def test_prefix_cache_hit_rate_moves(server):
    # a system prompt of ~300 tokens: at least two whole KV blocks of the CPU's default 128 tokens are shared
    system = "You are a meticulous assistant. " * 48
    for q in ("What is 2+2?", "What is 3+3?"):
        httpx.post(server.url + "/v1/chat/completions", json={
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": 2, "temperature": 0}, timeout=60)
    assert _metrics(server.url)["rtp_llm_prefix_cache_hit_tokens_total"] >= 256
