"""What real client libraries send and expect (the openai SDK, the OpenAI Agents SDK, LangChain, instructor,
pydantic-ai, LlamaIndex, LiteLLM, vLLM's own clients), each as the request body that library sends, against real
servers: the embedded default model (its own template cannot show tools) and a tiny random model with a Hermes tool
template."""

import json
import os

import httpx
import jsonschema
import openai
import pytest

from rtp_llm.models.default_model import SERVED_NAME, default_model_path
from tests.server.server_process import tiny_server
from tests.server.tool_requests import ASK, HERMES, SCHEMAS, TOOLS, WEATHER, calls_of, reassemble

ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}}, "required": ["answer"]}


@pytest.fixture(scope="module")
def tools_server(tiny_model):
    srv = tiny_server(tiny_model, "--chat_template", HERMES)
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def lenient_server(tiny_model):
    srv = tiny_server(tiny_model, "--chat_template", HERMES, "--strict_json_schemas", "0", "--unknown_fields", "ignore")
    yield srv
    assert srv.stop() == 0


def client_of(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=120)


# --- 1. null means the default ------------------------------------------------------------------------------
NULLS = {"temperature": None, "top_p": None, "n": None, "stream": None, "logprobs": None, "top_logprobs": None,
         "presence_penalty": None, "frequency_penalty": None, "parallel_tool_calls": None, "stop": None,
         "max_completion_tokens": None, "stream_options": None, "user": None, "tool_choice": None, "tools": None,
         "response_format": None}


def test_an_explicit_null_is_the_default(server):
    """The openai SDK sends null for every argument application code passes as None."""
    base = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "seed": 3}
    plain = post(server, "/v1/chat/completions", base)
    nulls = post(server, "/v1/chat/completions", {**base, **NULLS})
    assert nulls.status_code == 200, nulls.text
    # temperature null is 1.0 and seed 3 samples the same tokens as when temperature is left out
    assert nulls.json()["choices"] == plain.json()["choices"]
    comp = {"prompt": "Once upon", "max_tokens": 6, "seed": 1}
    a = post(server, "/v1/completions", {**comp, "n": None, "echo": None, "logprobs": None, "suffix": None})
    assert a.status_code == 200, a.text
    assert a.json()["choices"][0]["text"] == post(server, "/v1/completions", comp).json()["choices"][0]["text"]
    bad = post(server, "/v1/chat/completions", {**base, "messages": None})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


# --- 2. the assistant message sent back as the SDK dumps it --------------------------------------------------
def test_the_sdk_message_dump_goes_back_into_the_conversation(server):
    client = client_of(server)
    msgs = [{"role": "user", "content": "Say hi."}]
    first = client.chat.completions.create(model=SERVED_NAME, messages=msgs, max_tokens=6, temperature=0)
    dumped = first.choices[0].message.model_dump()
    assert {"refusal", "function_call", "audio", "tool_calls"} <= set(dumped)  # the fields that used to be 400s
    msgs += [dumped, {"role": "user", "content": "Again."}]
    again = client.chat.completions.create(model=SERVED_NAME, messages=msgs, max_tokens=6, temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length")
    # the null extras render nothing: the same prompt as the bare assistant message
    bare = msgs[:1] + [{"role": "assistant", "content": dumped["content"]}] + msgs[2:]
    assert post(server, "/tokenize", {"messages": msgs}).json() == post(server, "/tokenize", {"messages": bare}).json()
    # a refusal is what the assistant said
    refused = [msgs[0], {"role": "assistant", "content": None, "refusal": "I cannot."}]
    said = [msgs[0], {"role": "assistant", "content": "I cannot."}]
    assert post(server, "/tokenize", {"messages": refused}).json() == post(server, "/tokenize",
                                                                           {"messages": said}).json()
    audio = post(server, "/v1/chat/completions", {"messages": [msgs[0], {"role": "assistant", "content": "x",
                                                                          "audio": {"id": "a1"}}], "max_tokens": 2})
    assert audio.status_code == 400 and audio.json()["error"]["param"] == "messages.1.audio"
    assert "audio" in audio.json()["error"]["message"]


# --- 3. tools together with response_format ------------------------------------------------------------------
def test_forced_calls_with_a_response_format_are_calls(tools_server):
    """The Agents SDK's tools + output_type: the format shapes a text answer, a forced call is none."""
    r = client_of(tools_server).chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=80, seed=2, tool_choice="required",
        response_format={"type": "json_schema", "json_schema": {"name": "Answer", "schema": ANSWER}})
    for name, args in calls_of(r.choices[0].message):
        jsonschema.validate(json.loads(args), SCHEMAS[name])
    assert r.choices[0].message.tool_calls


def test_auto_with_a_response_format_answers_in_the_format_or_calls_a_tool(tools_server):
    body = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=120, temperature=1.0, n=6, seed=11,
                response_format={"type": "json_schema", "json_schema": {"name": "Answer", "schema": ANSWER,
                                                                        "description": "the final answer"}})
    r = client_of(tools_server).chat.completions.create(**body)
    kinds = set()
    for c in r.choices:
        if c.message.tool_calls:
            kinds.add("call")
            assert c.finish_reason == "tool_calls" and not c.message.content
            for name, args in calls_of(c.message):
                jsonschema.validate(json.loads(args), SCHEMAS[name])
        else:
            kinds.add("answer")
            jsonschema.validate(json.loads(c.message.content), {**ANSWER, "additionalProperties": False})
    assert kinds == {"answer", "call"}  # each choice is one of the two (this seed's six choices show both)
    streamed = reassemble(client_of(tools_server).chat.completions.create(stream=True, **body))
    assert [(s["content"] or None, [(x["name"], x["arguments"]) for x in s["calls"].values()]) for s in streamed] \
        == [(c.message.content, calls_of(c.message)) for c in r.choices]


# --- 4. a forced call cut by max_tokens, and arguments streamed as they come -----------------------------------
@pytest.mark.parametrize("choice,max_tokens", [({"type": "function", "function": {"name": "get_weather"}}, 5),
                                               ("required", 14)])
def test_a_forced_call_cut_by_max_tokens_is_still_a_tool_call(tools_server, choice, max_tokens):
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=max_tokens, seed=5, tool_choice=choice)
    c = client_of(tools_server).chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "length" and c.message.content is None
    (name, args), = calls_of(c.message)[:1]
    assert name in SCHEMAS and args  # the arguments written so far: not JSON yet
    with pytest.raises(json.JSONDecodeError):
        json.loads(args)
    s = reassemble(client_of(tools_server).chat.completions.create(stream=True, **kw))[0]
    assert s["finish"] == "length" and s["content"] == ""
    assert [(x["name"], x["arguments"]) for x in s["calls"].values()] == calls_of(c.message)


def test_forced_call_arguments_stream_in_pieces(tools_server):
    """instructor's partial objects read the argument deltas as they come."""
    stream = client_of(tools_server).chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=60, seed=8, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    pieces = [tc.function.arguments for ch in stream for c in ch.choices for tc in c.delta.tool_calls or []
              if tc.function and tc.function.arguments]
    assert len(pieces) >= 3
    jsonschema.validate(json.loads("".join(pieces)), WEATHER)


# --- strict schemas ------------------------------------------------------------------------------------------
def _comma_biased(srv, lenient):
    """A schema naming one boolean property; the comma pushed up as far as logit_bias goes: strict closes the
    object (the only way on), lenient writes a second, unnamed property."""
    from rtp_llm.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.load(default_model_path())
    bias = {str(t): 100 for t in tok.encode(",", add_special_tokens=False)}
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = post(srv, "/v1/chat/completions", {"messages": ASK, "max_tokens": 24, "temperature": 0, "logit_bias": bias,
                                           "response_format": {"type": "json_schema",
                                                               "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_schemas_are_strict_unless_the_flag_says_lenient(tools_server, lenient_server):
    strict = _comma_biased(tools_server, False)
    assert set(json.loads(strict)) == {"ok"}
    lenient = _comma_biased(lenient_server, True)
    assert lenient.replace(" ", "").startswith(('{"ok":true,', '{"ok":false,')), lenient


# --- 5. the default server runs an agent's tool loop ---------------------------------------------------------
def test_the_embedded_model_takes_tools_with_auto_and_a_tool_loop(server):
    weather = TOOLS[:1]
    r = post(server, "/v1/chat/completions", {"messages": ASK, "tools": weather, "max_tokens": 24, "seed": 1})
    assert r.status_code == 200, r.text  # tool_choice auto, every library's default with tools
    shown = post(server, "/tokenize", {"messages": ASK, "tools": weather, "return_token_strs": False}).json()
    text = post(server, "/detokenize", {"tokens": shown["tokens"]}).json()["prompt"]
    assert "<tools>" in text and '"name": "get_weather"' in text and "<tool_call>" in text
    loop = ASK + [{"role": "assistant", "content": None, "refusal": None, "audio": None, "function_call": None,
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"}]
    answer = post(server, "/v1/chat/completions", {"messages": loop, "tools": weather, "max_tokens": 16, "seed": 1})
    assert answer.status_code == 200, answer.text
    ids = post(server, "/tokenize", {"messages": loop, "tools": weather}).json()["tokens"]
    text = post(server, "/detokenize", {"tokens": ids}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n21 C, sunny\n</tool_response>" in text
    # a request without tools keeps the model's own template (its default system prompt)
    plain = post(server, "/tokenize", {"messages": ASK}).json()["tokens"]
    assert "named SmolLM" in post(server, "/detokenize", {"tokens": plain}).json()["prompt"]
    assert "chatml_tools" in server.output()


# --- 6 and 8: vLLM's and OpenAI's smaller shapes; refusals in the log ------------------------------------------
def test_vllm_client_shapes(server):
    assert post(server, "/tokenize", {"model": SERVED_NAME, "prompt": "hi"}).status_code == 200
    wrong = post(server, "/tokenize", {"model": "nope", "prompt": "hi"})
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
    assert post(server, "/detokenize", {"model": SERVED_NAME, "tokens": [1, 2]}).status_code == 200
    chat = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2}).json()
    assert chat["prompt_logprobs"] is None and chat["prompt_token_ids"] is None
    comp = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 2}).json()
    assert all(c["prompt_logprobs"] is None and c["prompt_token_ids"] is None for c in comp["choices"])
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "messages": ASK, "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[0]["usage"]["completion_tokens"] == 0 and events[1]["usage"]["completion_tokens"] >= 1


def test_json_schema_description_is_accepted_and_refusals_are_logged(server):
    schema = {"name": "Answer", "description": "what the user asked", "schema": ANSWER}
    ok = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 30,
                                               "response_format": {"type": "json_schema", "json_schema": schema}})
    assert ok.status_code == 200, ok.text
    secret = "my-secret-prompt-text"
    bad = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": secret}], "nope": 1})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "unsupported_parameter"
    log = server.output()
    assert "rejected POST /v1/chat/completions: 400 nope:" in log and secret not in log


def test_unknown_fields_flag_ignores_them_with_one_warning(lenient_server):
    body = {"messages": ASK, "max_tokens": 2, "vendor_field": {"x": 1}}
    for _ in range(2):
        r = post(lenient_server, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
    assert lenient_server.output().count("unknown request field 'vendor_field'") == 1


# --- the bodies real libraries send (recorded by client_bodies/record.py from the libraries themselves) -------------
BODIES = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "client_bodies", "bodies.json")))


def _sse_events(srv, path, body):
    with httpx.stream("POST", srv.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def _text_format(body):
    """The JSON schema a text answer must follow, as the body asked (chat's response_format or Responses' text)."""
    rf = body.get("response_format") or {}
    if rf.get("type") == "json_schema":
        return rf["json_schema"]["schema"]
    fmt = (body.get("text") or {}).get("format") or {}
    return fmt.get("schema")


@pytest.mark.parametrize("recorded", BODIES, ids=[b["use"] for b in BODIES])
def test_what_each_library_sends_gets_what_it_reads(tools_server, recorded):
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

    body, path = {**recorded["body"], "model": "tiny", "max_tokens": 300}, recorded["path"]
    if path.endswith("/responses"):
        body["max_output_tokens"] = body.pop("max_tokens")
    tool_schemas = {(t.get("function") or t)["name"]: (t.get("function") or t)["parameters"]
                    for t in body.get("tools", [])}
    if body.get("stream"):
        events = _sse_events(tools_server, path, body)
        finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        if not isinstance(body.get("tool_choice"), dict):  # a streamed answer (LlamaIndex, LiteLLM): text deltas
            text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
            assert text and finish in (["stop"], ["length"])
            return
        # instructor's partial objects: the forced call's arguments arrive in pieces
        pieces = [tc["function"]["arguments"] for e in events for c in e["choices"]
                  for tc in c["delta"].get("tool_calls") or [] if tc.get("function", {}).get("arguments")]
        assert len(pieces) >= 2
        name = body["tool_choice"]["function"]["name"]
        if finish == ["tool_calls"]:
            jsonschema.validate(json.loads("".join(pieces)), tool_schemas[name])
        return
    r = httpx.post(tools_server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    schema = _text_format(body)
    if path.endswith("/responses"):
        resp = Response.model_validate(r.json())  # what the Agents SDK parses
        calls = [o for o in resp.output if o.type == "function_call"]
        text = resp.output_text
        call_args = [(c.name, c.arguments) for c in calls]
        cut = resp.status == "incomplete"
    else:
        choice = ChatCompletion.model_validate(r.json()).choices[0]
        text = choice.message.content
        call_args = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        cut = choice.finish_reason == "length"
    if isinstance(body.get("tool_choice"), dict):  # instructor: the named call, always
        assert [n for n, _ in call_args] == [body["tool_choice"]["function"]["name"]]
    if body.get("tool_choice") == "required":  # LlamaIndex's structured_predict: a call of a declared tool
        assert call_args and all(n in tool_schemas for n, _ in call_args)
    if body.get("parallel_tool_calls") is False:  # LlamaIndex asks for one call at most
        assert len(call_args) <= 1
    for name, args in call_args:
        if not cut:
            jsonschema.validate(json.loads(args), tool_schemas[name])
    if not call_args and schema is not None and not cut:
        jsonschema.validate(json.loads(text), schema)  # the answer in the format, with tools offered or not
