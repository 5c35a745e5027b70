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
