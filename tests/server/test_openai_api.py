"""The official `openai` client against a real server on the embedded model."""

import os

import httpx
import openai
import pytest

from rtp_llm.models.default_model import SERVED_NAME, default_model_path

CONV = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    gguf = default_model_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [SERVED_NAME]


def test_chat_streamed_equals_non_streamed_and_usage_is_right(client, hf_tokenizer):
    full = client.chat.completions.create(model=SERVED_NAME, messages=CONV, max_tokens=40, temperature=0)
    text = full.choices[0].message.content
    assert "Paris" in text
    assert full.choices[0].finish_reason == "stop"
    prompt_ids = hf_tokenizer.apply_chat_template(CONV, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = prompt_ids["input_ids"]
    assert full.usage.prompt_tokens == len(prompt_ids)
    # completion tokens: the answer's tokens plus the <|im_end|> that ended it
    assert full.usage.completion_tokens == len(hf_tokenizer.encode(text)) + 1
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    stream = client.chat.completions.create(model=SERVED_NAME, messages=CONV, max_tokens=40, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_completions_streamed_equals_non_streamed_with_logprobs(client):
    kw = dict(model=SERVED_NAME, prompt="The three primary colors are", max_tokens=20, temperature=0, logprobs=2)
    full = client.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    assert full.usage.completion_tokens == 20 == len(choice.logprobs.tokens)
    assert "".join(choice.logprobs.tokens) == choice.text
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert all(len(t) == 2 for t in choice.logprobs.top_logprobs)
    # greedy: the chosen token is the most likely one
    assert all(abs(max(t.values()) - lp) < 1e-4 for t, lp in zip(choice.logprobs.top_logprobs,
                                                                   choice.logprobs.token_logprobs))
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert streamed == choice.text


def test_completions_many_prompts_n_stop_and_seed(client):
    out = client.completions.create(model=SERVED_NAME, prompt=["Hello, my name is", "The weather today"], n=2,
                                    max_tokens=12, temperature=0.8, seed=7)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    again = client.completions.create(model=SERVED_NAME, prompt=["Hello, my name is", "The weather today"], n=2,
                                      max_tokens=12, temperature=0.8, seed=7)
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == \
           [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    base = client.completions.create(model=SERVED_NAME, prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0)
    stop = base.choices[0].text[4:6]
    stopped = client.completions.create(model=SERVED_NAME, prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0,
                                        stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == base.choices[0].text[: base.choices[0].text.find(stop)]


def test_chat_logprobs_and_n(client):
    out = client.chat.completions.create(model=SERVED_NAME, messages=CONV, max_tokens=5, temperature=1.0, n=3,
                                         seed=3, logprobs=True, top_logprobs=3)
    assert len(out.choices) == 3
    for c in out.choices:
        assert len(c.logprobs.content) >= 1
        assert all(len(t.top_logprobs) == 3 for t in c.logprobs.content)


def test_unknown_model_is_404_with_error_body(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-5", messages=CONV, max_tokens=2)
    assert err.value.body["code"] == "model_not_found"


def test_prompt_over_max_model_len_is_400(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [5] * 1030, "max_tokens": 1}, timeout=30)
    assert r.status_code == 400
    assert "max_model_len" in r.json()["error"]["message"]


def test_the_client_learns_that_an_unimplemented_feature_was_refused(client):
    """The official client's own parameters this server does not implement come back as BadRequestError naming
    them, instead of a normal-looking answer that ignored them."""
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=SERVED_NAME, messages=CONV, max_tokens=2,
                                       prediction={"type": "content", "content": "Paris"})
    assert err.value.body["param"] == "prediction" and err.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SERVED_NAME, prompt="x", max_tokens=2, best_of=2)
    assert err.value.body["param"] == "best_of"


def test_logit_bias_through_the_client(client):
    """OpenAI's logit_bias: +100 on one token makes a greedy answer that token throughout; a token id outside the
    vocabulary or a bias outside [-100, 100] is a 400 naming the problem."""
    out = client.chat.completions.create(model=SERVED_NAME, messages=CONV, max_tokens=4, temperature=0,
                                         logit_bias={"28": 100})
    assert out.choices[0].message.content == "," * 4  # token 28 is "," in the SmolLM2 vocabulary
    plain = client.completions.create(model=SERVED_NAME, prompt="The capital of France is", max_tokens=1,
                                      temperature=0)
    word = plain.choices[0].text.strip()  # the greedy first word (vLLM's bad_words: a word, any spacing)
    assert word
    banned = client.completions.create(model=SERVED_NAME, prompt="The capital of France is", max_tokens=3,
                                       temperature=0, extra_body={"bad_words": [word]})
    assert banned.choices[0].text and word not in banned.choices[0].text
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SERVED_NAME, prompt="x", max_tokens=2, logit_bias={"999999": 5})
    assert "outside the vocabulary" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SERVED_NAME, prompt="x", max_tokens=2, logit_bias={"5": 101})
    assert "[-100, 100]" in err.value.body["message"]


def test_user_is_recorded_with_the_request(client, server):
    """`user` (OpenAI: the end user's id, for abuse monitoring) goes into the request's log line."""
    out = client.chat.completions.create(model=SERVED_NAME, messages=CONV, max_tokens=3, user="alice-42")
    line = next(x for x in server.output().splitlines() if f"request {out.id} finished" in x)
    assert "user='alice-42'" in line
    out = client.chat.completions.create(model=SERVED_NAME, messages=CONV, max_tokens=3)
    line = next(x for x in server.output().splitlines() if f"request {out.id} finished" in x)
    assert "user=" not in line
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=SERVED_NAME, messages=CONV, max_tokens=2, user="u" * 300)


def test_a_generating_server_refuses_pooling_routes(server):
    for path, body in (("/v1/embeddings", {"input": "hi"}), ("/v1/score", {"text_1": "a", "text_2": "b"}),
                       ("/v1/rerank", {"query": "a", "documents": ["b"]})):
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 400 and "--runner pooling" in r.json()["error"]["message"], r.text
