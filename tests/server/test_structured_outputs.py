"""Structured outputs through the official openai client against real servers: the embedded SmolLM2 and a tiny
random model (garbage unconstrained). Every answer parses and validates against its schema with jsonschema;
streamed == non-streamed; the constraint fields of OpenAI and vLLM; bad constraints are 400s naming their field."""

import json
import re

import httpx
import jsonschema
import openai
import pytest

from rtp_llm.models.default_model import SERVED_NAME, default_model_path
from tests.server.server_process import ServerProcess

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Chinese"]}, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False},
    "email": {"type": "string", "maxLength": 30}},
    "required": ["name", "age", "languages", "address"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Invent a person and describe them as JSON."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tiny_client(tmp_path_factory):
    from tests.models.tiny_checkpoints import make_checkpoint

    path = tmp_path_factory.mktemp("tiny_full_vocab")
    make_checkpoint(path, "llama_full_vocab")
    srv = ServerProcess("--model", str(path), "--tokenizer_path", default_model_path(), "--max_model_len", "512",
                        "--kv_cache_memory_gb", "0.1", "--served_model_name", "tiny")
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120), srv
    assert srv.stop() == 0


def schema_format(schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}


def test_json_schema_answers_validate_and_stream_the_same(client):
    kw = dict(model=SERVED_NAME, messages=ASK, max_tokens=160, response_format=schema_format(PERSON))
    greedy = client.chat.completions.create(temperature=0, **kw)
    assert greedy.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(greedy.choices[0].message.content), PERSON)
    sampled = client.chat.completions.create(temperature=1.0, seed=3, n=3, **kw)
    for c in sampled.choices:
        jsonschema.validate(json.loads(c.message.content), PERSON)
    for ref, kw2 in ((greedy, dict(temperature=0)), (sampled, dict(temperature=1.0, seed=3, n=3))):
        parts = {}
        for chunk in client.chat.completions.create(stream=True, **kw, **kw2):
            for c in chunk.choices:
                parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
        assert [parts[i] for i in range(len(ref.choices))] == [c.message.content for c in ref.choices]


def test_json_object_and_completions(client):
    chat = client.chat.completions.create(model=SERVED_NAME, messages=ASK, max_tokens=120, temperature=0,
                                          response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    cmpl = client.completions.create(model=SERVED_NAME, prompt="A JSON object describing a cat:", max_tokens=160,
                                     temperature=0, extra_body={"response_format": schema_format(PERSON)})
    jsonschema.validate(json.loads(cmpl.choices[0].text), PERSON)
    text = client.chat.completions.create(model=SERVED_NAME, messages=ASK, max_tokens=8, temperature=0,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content  # type text: no constraint, accepted


def test_vllm_constraint_fields(client):
    def ask(extra, **kw):
        r = client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": "Pick one."}],
                                           max_tokens=30, temperature=0.8, seed=1, extra_body=extra, **kw)
        return r.choices[0].message.content

    assert ask({"guided_choice": ["red", "green", "blue"]}) in ("red", "green", "blue")
    assert ask({"structured_outputs": {"choice": ["yes", "no"]}}) in ("yes", "no")
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", ask({"guided_regex": r"[0-9]{3}-[0-9]{4}"}))
    assert re.fullmatch(r"[0-9]{2}:[0-9]{2}", ask({"structured_outputs": {"regex": r"[0-9]{2}:[0-9]{2}"}}))
    gbnf = 'root ::= "color: " ("red" | "blue") "; size: " [1-9]'
    assert re.fullmatch(r"color: (red|blue); size: [1-9]", ask({"guided_grammar": gbnf}))
    lark = 'start: "n=" /[0-9]{2}/'
    assert re.fullmatch(r"n=[0-9]{2}", ask({"structured_outputs": {"grammar": lark}}))
    small = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
             "additionalProperties": False}
    jsonschema.validate(json.loads(ask({"guided_json": small})), small)
    jsonschema.validate(json.loads(ask({"structured_outputs": {"json": small}})), small)


def test_tiny_random_model_answers_validate(tiny_client):
    client, _ = tiny_client
    free = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=60, temperature=0)
    with pytest.raises(json.JSONDecodeError):
        json.loads(free.choices[0].message.content)
    schema = {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9},
        "kind": {"enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
        "required": ["id", "kind", "tags"], "additionalProperties": False}
    r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=100, temperature=1.0, seed=2, n=4,
                                       response_format=schema_format(schema))
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), schema)


@pytest.mark.parametrize("extra,param,words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format.json_schema", "objekt"),
    ({"guided_regex": "[a-z"}, "guided_regex", "regex"),
    ({"guided_grammar": 'root ::= ( "a"'}, "guided_grammar", "grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"guided_choice": []}, "guided_choice", "choice"),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex", "at most one"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
])
def test_a_bad_constraint_is_a_400_naming_its_field(server, extra, param, words):
    body = {"messages": ASK, "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"]
    assert err["param"] == param
    # The server still answers.
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
