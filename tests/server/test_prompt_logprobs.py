"""Prompt logprobs through the API, with the official openai client, against transformers' logits on the same
weights: vLLM's prompt_logprobs (completions per choice, chat at the top level), OpenAI's legacy completions echo
with logprobs (the prompt tokens' logprobs first, the first one null; streamed the same), -1 = the whole
vocabulary where --max_logprobs allows it, and the 400s where it does not."""

import json
import math

import httpx
import openai
import pytest
import torch

from rtp_llm.models.default_model import default_model_path
from tests.server.server_process import ServerProcess

PROMPT = "The quick brown fox jumps over the lazy dog near the river bank"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.models.tiny_checkpoints import make_checkpoint

    path = tmp_path_factory.mktemp("tiny_full_vocab")
    hf = make_checkpoint(path, "llama_full_vocab")
    return str(path), hf


def start(model, *flags):
    return ServerProcess("--model", model, "--tokenizer_path", default_model_path(), "--max_model_len", "256",
                         "--kv_cache_memory_gb", "0.1", "--served_model_name", "tiny", *flags)


@pytest.fixture(scope="module")
def srv(tiny):
    s = start(tiny[0], "--max_logprobs", "-1")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def capped(tiny):
    s = start(tiny[0])  # --max_logprobs 20, vLLM's default
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def reference(hf, ids):
    """transformers' log-probabilities; row j predicts token j + 1."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].double().log_softmax(-1)


def test_completions_prompt_logprobs_match_transformers(tiny, client):
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0,
                                    extra_body={"prompt_logprobs": 2, "return_token_ids": True})
    choice = out.choices[0]
    ids = choice.prompt_token_ids
    entries = choice.prompt_logprobs
    assert len(entries) == len(ids) == out.usage.prompt_tokens and entries[0] is None
    ref = reference(tiny[1], ids)
    for j in range(1, len(ids)):
        entry, row = entries[j], ref[j - 1]
        mine = entry[str(ids[j])]  # the prompt token is always there, with its rank
        assert mine["logprob"] == pytest.approx(row[ids[j]].item(), abs=1e-4)
        chosen = row[ids[j]].item()  # rank: 1 + the tokens more likely (a near tie may fall either way)
        assert int((row > chosen + 1e-4).sum()) + 1 <= mine["rank"] <= int((row > chosen - 1e-4).sum()) + 1
        top = sorted(((v["rank"], int(t)) for t, v in entry.items() if v["rank"] <= 2))
        assert [t for _, t in top] == row.topk(2).indices.tolist()
        assert len(entry) in (2, 3)  # the 2 most likely and the prompt token (when it is not among them)


def test_chat_prompt_logprobs_cover_the_rendered_prompt(tiny, client):
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi there"}],
                                         max_tokens=2, temperature=0,
                                         extra_body={"prompt_logprobs": 0, "return_token_ids": True})
    ids = out.prompt_token_ids
    entries = out.prompt_logprobs
    assert len(entries) == len(ids) == out.usage.prompt_tokens and entries[0] is None
    ref = reference(tiny[1], ids)
    for j in range(1, len(ids)):
        assert list(entries[j]) == [str(ids[j])]  # 0: the prompt token alone
        assert entries[j][str(ids[j])]["logprob"] == pytest.approx(ref[j - 1][ids[j]].item(), abs=1e-4)


def test_echo_with_logprobs_puts_the_prompt_first(tiny, client, srv):
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1)
    echo = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, echo=True,
                                     extra_body={"return_token_ids": True})
    choice = echo.choices[0]
    ids = choice.prompt_token_ids
    lp = choice.logprobs
    n = len(ids)
    assert choice.text == PROMPT + plain.choices[0].text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = reference(tiny[1], ids)
    assert lp.token_logprobs[1:n] == pytest.approx([ref[j - 1][ids[j]].item() for j in range(1, n)], abs=1e-4)
    assert "".join(lp.tokens[:n]) == PROMPT
    # Then the answer's, as without echo (offsets moved past the prompt).
    p = plain.choices[0].logprobs
    assert lp.tokens[n:] == p.tokens and lp.token_logprobs[n:] == p.token_logprobs
    assert lp.text_offset[n:] == [o + len(PROMPT) for o in p.text_offset]
    assert lp.text_offset[:n] == sorted(lp.text_offset[:n]) and lp.text_offset[0] == 0
    # Streamed: the first chunk carries the prompt and its logprobs; all chunks together are the answer above.
    text, tokens, values = "", [], []
    with httpx.stream("POST", srv.url + "/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 1, "echo": True,
            "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["text"].startswith(PROMPT)
    for e in events:
        c = e["choices"][0]
        text += c["text"]
        if c["logprobs"]:
            tokens += c["logprobs"]["tokens"]
            values += c["logprobs"]["token_logprobs"]
    assert text == choice.text and tokens == lp.tokens and values == lp.token_logprobs


def test_minus_one_is_the_whole_vocabulary(client):
    out = client.completions.create(model="tiny", prompt="Hello", max_tokens=2, temperature=0, logprobs=-1,
                                    extra_body={"prompt_logprobs": -1, "return_tokens_as_token_ids": True})
    choice = out.choices[0]
    vocab = 49152
    for top in choice.logprobs.top_logprobs:  # token_id:<id> keys: every id once
        assert len(top) == vocab
        assert math.fsum(math.exp(v) for v in top.values()) == pytest.approx(1.0, abs=1e-4)
    for entry in choice.prompt_logprobs[1:]:
        assert len(entry) == vocab
        assert sorted(v["rank"] for v in entry.values()) == list(range(1, vocab + 1))
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                          temperature=0, logprobs=True, top_logprobs=-1)
    assert len(chat.choices[0].logprobs.content[0].top_logprobs) == vocab


@pytest.mark.parametrize("body,field", [
    ({"prompt": "Hi", "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt": "Hi", "prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt": "Hi", "logprobs": -1}, "logprobs"),
    ({"prompt": "Hi", "logprobs": 21}, "logprobs"),
    ({"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
])
def test_the_cap_is_a_400_naming_the_field(capped, body, field):
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = httpx.post(capped.url + route, json={"model": "tiny", "max_tokens": 2, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "max_logprobs=20" in err["message"]


@pytest.mark.parametrize("body", [
    {"prompt": "Hi", "prompt_logprobs": 1, "stream": True},
    {"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 0, "stream": True},
    {"prompt": "Hi", "prompt_logprobs": -2},
])
def test_prompt_logprobs_refused_where_vllm_refuses_them(capped, body):
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = httpx.post(capped.url + route, json={"model": "tiny", "max_tokens": 2, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt_logprobs" and "prompt_logprobs" in err["message"]


@pytest.mark.parametrize("body,field", [
    ({"prompt": "Hi", "logprobs": 49153}, "logprobs"),
    ({"prompt": "Hi there", "prompt_logprobs": 100000}, "prompt_logprobs"),
    ({"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 100000}, "top_logprobs"),
])
def test_more_than_the_vocabulary_is_a_400_not_a_clamp(srv, body, field):
    """Without a cap, a count above the vocabulary is refused: an answer holding fewer than asked would be a silent
    change of what the client asked for."""
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = httpx.post(srv.url + route, json={"model": "tiny", "max_tokens": 2, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "exceeds the vocabulary (49152 tokens)" in err["message"]
