"""Every request field is implemented or refused by name: the fields whose effect depends on another one (echo,
return_tokens_as_token_ids, disable_any_whitespace, the tokenize flags) are 400s naming them where they would do
nothing, and do what they say otherwise."""

import json

import httpx
import pytest

CHAT, CMPL = "/v1/chat/completions", "/v1/completions"
MSGS = [{"role": "user", "content": "Describe a cat as JSON."}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "legs": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["name", "legs"], "additionalProperties": False}


@pytest.mark.parametrize("path,body,param,words", [
    (CHAT, {"messages": MSGS, "structured_outputs": {"regex": "[a-z]+", "disable_any_whitespace": True}},
     "structured_outputs", "disable_any_whitespace applies to json"),
    (CHAT, {"messages": MSGS, "echo": True}, "echo", "echo repeats the last message"),
    (CHAT, {"messages": MSGS, "return_tokens_as_token_ids": True}, "return_tokens_as_token_ids", "needs logprobs"),
    (CMPL, {"prompt": "Hi", "return_tokens_as_token_ids": True}, "return_tokens_as_token_ids", "needs logprobs"),
    ("/tokenize", {"prompt": "Hi", "add_generation_prompt": False}, "add_generation_prompt", "go with messages"),
    ("/tokenize", {"prompt": "Hi", "messages": MSGS}, "prompt", "exactly one of prompt or messages"),
    (CHAT, {"messages": MSGS, "top_logprobs": 3}, "top_logprobs", "needs logprobs=true"),
    (CMPL, {"prompt": "Hi", "stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    (CHAT, {"messages": MSGS + [{"role": "assistant", "content": "A"}], "continue_final_message": True},
     "continue_final_message", "cannot both be true"),
    (CHAT, {"messages": MSGS, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}]},
     "tools.0.function.parameters", "not a valid JSON schema"),
])
def test_a_field_that_would_do_nothing_is_a_400_naming_it(server, path, body, param, words):
    r = httpx.post(server.url + path, json={**({} if path == "/tokenize" else {"max_tokens": 4}), **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"], err
    assert err["param"] == param  # the field to change, never only in the message


def test_the_dependent_fields_work_where_they_apply(server):
    # disable_any_whitespace: the JSON is written with ", " and ": " only
    r = httpx.post(server.url + CHAT, json={"messages": MSGS, "max_tokens": 80, "temperature": 0,
                                           "structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
                   timeout=60).json()
    text = r["choices"][0]["message"]["content"]
    assert json.dumps(json.loads(text)) == text
    # return_tokens_as_token_ids with logprobs=0 (falsy, but asked for)
    c = httpx.post(server.url + CMPL, json={"prompt": "Hi", "max_tokens": 3, "logprobs": 0, "temperature": 0,
                                           "return_tokens_as_token_ids": True}, timeout=60).json()["choices"][0]
    assert all(t.startswith("token_id:") for t in c["logprobs"]["tokens"])
    # /tokenize: add_special_tokens is honoured for messages as for a prompt; add_generation_prompt for messages
    text = httpx.post(server.url + "/detokenize", json={"tokens": httpx.post(
        server.url + "/tokenize", json={"messages": MSGS}, timeout=30).json()["tokens"]}, timeout=30).json()["prompt"]
    for special in (True, False):
        via_messages = httpx.post(server.url + "/tokenize", json={"messages": MSGS, "add_special_tokens": special},
                                  timeout=30).json()["tokens"]
        via_prompt = httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": special},
                                timeout=30).json()["tokens"]
        assert via_messages == via_prompt
    shorter = httpx.post(server.url + "/tokenize", json={"messages": MSGS, "add_generation_prompt": False},
                         timeout=30).json()["tokens"]
    assert len(shorter) < len(via_messages)
