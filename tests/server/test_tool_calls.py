"""Tool calls and reasoning through the official openai client against real servers on a tiny random model (whose
free answers are garbage): forced calls (tool_choice named / required) validate against the tools' schemas; auto
calls are parsed from what the model writes (scripted here with guided_choice, so the text is known); tools,
assistant tool calls and tool results reach the template as transformers passes them; streams reassemble to the
whole answer; reasoning goes to reasoning_content."""

import json

import httpx
import jsonschema
import openai
import pytest

from rtp_llm.models.default_model import SERVED_NAME, default_model_path
from tests.server.server_process import tiny_server
from tests.server.tool_requests import ASK, HERMES, SCHEMAS, THINKING, TIME, TOOLS, WEATHER, calls_of, reassemble


@pytest.fixture(scope="module")
def tools_server(tiny_model):
    srv = tiny_server(tiny_model, "--chat_template", HERMES)  # the parser comes from the template: hermes
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(tools_server):
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_named_tool_choice_forces_a_valid_call(client):
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=80, temperature=1.0, seed=4, n=3,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = client.chat.completions.create(**kw)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None
        (name, args), = calls_of(c.message)
        assert name == "get_weather" and c.message.tool_calls[0].id.startswith("call_")
        jsonschema.validate(json.loads(args), WEATHER)
    streamed = reassemble(client.chat.completions.create(stream=True, **kw))
    for c, s in zip(r.choices, streamed):
        assert s["finish"] == "tool_calls" and s["content"] == ""
        assert [(x["name"], x["arguments"]) for x in s["calls"].values()] == calls_of(c.message)


def test_required_tool_choice_calls_one_or_more_valid_tools(client):
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200, temperature=1.0, seed=9, n=4,
              tool_choice="required")
    r = client.chat.completions.create(**kw)
    names = set()
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c.message
        assert c.message.tool_calls
        for name, args in calls_of(c.message):
            jsonschema.validate(json.loads(args), SCHEMAS[name])
            names.add(name)
    streamed = reassemble(client.chat.completions.create(stream=True, **kw))
    assert [[(x["name"], x["arguments"]) for x in s["calls"].values()] for s in streamed] == \
        [calls_of(c.message) for c in r.choices]
    one = client.chat.completions.create(**{**kw, "parallel_tool_calls": False})
    assert all(len(c.message.tool_calls) == 1 for c in one.choices)


SCRIPTED = [
    ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
     '</tool_call>', "Checking.", [("get_weather", {"city": "Paris", "unit": "celsius"})], "tool_calls"),
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>\n<tool_call>\n'
     '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>', None,
     [("get_time", {"zone": "CET"}), ("get_weather", {"city": "Oslo", "unit": "celsius"})], "tool_calls"),
    ('<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>', [], "stop"),
    ("It is sunny in Paris.", "It is sunny in Paris.", [], "stop"),
    # A whole answer that is one bare JSON call of a declared tool (what Qwen2.5-Coder-0.5B writes), or a list
    # in the parameters form, is a call; JSON naming no declared tool stays content.
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [("get_weather", {"city": "Paris"})],
     "tool_calls"),
    ('[{"name": "get_time", "parameters": {"zone": "CET"}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]',
     None, [("get_time", {"zone": "CET"}), ("get_weather", {"city": "Rome"})], "tool_calls"),
    ('{"name": "Bob", "arguments": {"age": 3}}', '{"name": "Bob", "arguments": {"age": 3}}', [], "stop"),
]


@pytest.mark.parametrize("text,content,calls,finish", SCRIPTED)
def test_auto_tool_choice_parses_what_the_model_writes(client, text, content, calls, finish):
    """guided_choice scripts the model's answer; tool_choice auto (the default with tools) parses it: calls, text
    around them as content, a malformed call left as content with a 200."""
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=120, temperature=0,
              extra_body={"guided_choice": [text]})
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.message.content == content and c.finish_reason == finish
    assert [(n, json.loads(a)) for n, a in calls_of(c.message)] == calls
    s = reassemble(client.chat.completions.create(stream=True, **kw))[0]
    assert s["content"] == (content or "") and s["finish"] == finish
    assert [(x["name"], json.loads(x["arguments"])) for x in s["calls"].values()] == calls
    assert len({x["id"] for x in s["calls"].values()}) == len(calls)


STRICT_TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME, "strict": True}},
                {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


@pytest.mark.parametrize("text,calls,parallel", [
    # a function the request did not offer: not a call
    ('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', [], True),
    # strict: arguments that do not validate are not a call; the same for a non-strict function is one
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "cet"}}\n</tool_call>', [], True),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": 5}}\n</tool_call>',
     [("get_weather", {"city": 5})], True),
    # parallel_tool_calls false: the first call only
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>\n<tool_call>\n'
     '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>',
     [("get_time", {"zone": "CET"})], False),
])
def test_auto_calls_honour_the_tools_strict_and_parallel_tool_calls(client, text, calls, parallel):
    kw = dict(model="tiny", messages=ASK, tools=STRICT_TOOLS, max_tokens=120, temperature=0,
              parallel_tool_calls=parallel, extra_body={"guided_choice": [text]})
    c = client.chat.completions.create(**kw).choices[0]
    assert [(n, json.loads(a)) for n, a in calls_of(c.message)] == calls
    if not calls:
        assert c.message.content == text and c.finish_reason == "stop"
    s = reassemble(client.chat.completions.create(stream=True, **kw))[0]
    assert [(x["name"], json.loads(x["arguments"])) for x in s["calls"].values()] == calls


def test_tool_choice_none_leaves_the_answer_as_content(client):
    text = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=60,
                                       temperature=0, extra_body={"guided_choice": [text]})
    assert r.choices[0].message.content == text and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_a_conversation_with_tool_results_renders_as_transformers_does(tools_server, client):
    """tools, an assistant turn with tool_calls and a tool turn, through the server's template rendering, give the
    token ids of transformers' apply_chat_template on the same template and messages."""
    from transformers import PreTrainedTokenizerFast

    from rtp_llm.tokenizer import Tokenizer

    first = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=80, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
                     {"role": "tool", "tool_call_id": call.id, "content": "22 C, clear"}]
    r = httpx.post(tools_server.url + "/tokenize", json={"messages": history, "tools": TOOLS}, timeout=60)
    assert r.status_code == 200, r.text
    ours = r.json()["tokens"]
    tok = Tokenizer.load(default_model_path())
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    ref_history = [dict(m) for m in history]
    ref_history[1] = {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "function": {
        "name": call.function.name, "arguments": json.loads(call.function.arguments)}}]}
    with open(HERMES) as f:
        template = f.read()
    text = hf.apply_chat_template(ref_history, tools=TOOLS, chat_template=template, tokenize=False,
                                  add_generation_prompt=True)
    assert ours == tok.encode(text, add_special_tokens=False)
    assert "<tool_response>\n22 C, clear\n</tool_response>" in text and call.function.name in text
    answer = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=4,
                                            temperature=0)
    assert answer.usage.prompt_tokens == len(ours)


@pytest.mark.parametrize("body,param,words", [
    ({"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among the tools"),
    ({"tools": TOOLS, "tool_choice": "required", "structured_outputs": {"json_object": True}}, "tool_choice",
     "cannot be combined"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools", "same name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name", "pattern"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools.0.function.parameters", "objekt"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "may not set messages"),
])
def test_bad_tool_requests_are_400s(tools_server, body, param, words):
    r = httpx.post(tools_server.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body},
                   timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"]
    assert err["param"] == param


def test_auto_needs_a_parser(thinking, server):
    """A --chat_template that names no tool-call format: auto is refused with the way out, not ignored. (The
    embedded model's own template gets rtp-llm's ChatML tool template instead: test_client_libraries.py.)"""
    with pytest.raises(openai.BadRequestError) as err:
        thinking.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=4)
    assert err.value.body["param"] == "tool_choice" and "--tool_call_parser" in err.value.body["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "model": SERVED_NAME, "messages": ASK, "tools": TOOLS, "max_tokens": 60, "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, timeout=60)
    assert r.status_code == 200
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]), TIME)


@pytest.fixture(scope="module")
def thinking(tiny_model):
    srv = tiny_server(tiny_model, "--chat_template", THINKING, "--reasoning_parser", "deepseek_r1")
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert srv.stop() == 0


def test_reasoning_content_and_chat_template_kwargs(thinking):
    """The template opens <think>: the (never closed) answer is reasoning; enable_thinking=false closes it in the
    prompt: a JSON constraint applies from the first token and the answer is content."""
    kw = dict(model="tiny", messages=ASK, max_tokens=24, temperature=1.0, seed=5)
    r = thinking.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert msg.reasoning_content and msg.content in (None, "")
    s = reassemble(thinking.chat.completions.create(stream=True, **kw))[0]
    assert s["reasoning"] == msg.reasoning_content and s["content"] == ""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    off = thinking.chat.completions.create(model="tiny", messages=ASK, max_tokens=40, temperature=0,
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "a", "schema": schema}},
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.reasoning_content is None
    jsonschema.validate(json.loads(off.choices[0].message.content), schema)
