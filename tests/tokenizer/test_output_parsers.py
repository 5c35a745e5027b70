"""Tool-call and reasoning parsers: the calls and text they find in answers written the way the models write them,
and the invariant the server relies on: fed in any pieces (a stream), they give what the whole answer gives."""

import json
import random

import pytest

from rtp_llm.server.chat_parsing import ChatOutputParser
from rtp_llm.tokenizer.reasoning_parser import ReasoningParser
from rtp_llm.tokenizer.tool_parsers import (ForcedCallParser, HermesParser, Llama3JsonParser, ToolCall,
                                            detect_tool_parser, make_tool_parser)


def run(parser, text, pieces):
    """Feeds text cut at `pieces` random places; returns the merged events."""
    rng = random.Random(pieces)
    cuts = sorted(rng.sample(range(1, len(text)), min(pieces, len(text) - 1))) if pieces and len(text) > 1 else []
    events = []
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        events += parser.feed(text[a:b])
    events += parser.finish()
    merged = []
    for kind, value in events:
        if merged and kind != "call" and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + value)
        else:
            merged.append((kind, value))
    return merged


def call(name, **args):
    return ("call", ToolCall(name, json.dumps(args, ensure_ascii=False)))


HERMES = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     [call("get_weather", city="Paris")]),
    ('Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n'
     '{"name": "b", "arguments": {"y": "é"}}\n</tool_call>\n',
     [("content", "Let me check."), call("a", x=1), call("b", y="é")]),
    ("No tools needed: 2 < 3 and <tool is not a tag.", [("content", "No tools needed: 2 < 3 and <tool is not a tag.")]),
    ('<tool_call>{"name": "f", "arguments": {bad}</tool_call>',
     [("content", '<tool_call>{"name": "f", "arguments": {bad}</tool_call>')]),
    ('<tool_call>{"name": "f", "arguments": "{\\"k\\": [1, 2]}"}</tool_call>', [call("f", k=[1, 2])]),
    ('Text <tool_call>{"name": "f", "arguments": {}}', [("content", "Text"), call("f")]),  # never closed (EOS)
    ('<tool_call>{"name": "f", "arguments": {"a"', [("content", '<tool_call>{"name": "f", "arguments": {"a"')]),
]


@pytest.mark.parametrize("text,want", HERMES)
@pytest.mark.parametrize("pieces", [0, 3, 17, 1000])
def test_hermes_calls_and_content(text, want, pieces):
    assert run(HermesParser(), text, pieces) == want


LLAMA3 = [
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [call("get_weather", city="Paris")]),
    ('{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}', [call("a", x=1), call("b")]),
    ("The weather is fine.", [("content", "The weather is fine.")]),
    ('{"name": "a", "parameters": {"x": 1}} and more', [("content", '{"name": "a", "parameters": {"x": 1}} and more')]),
    ('{"city": "Paris"}', [("content", '{"city": "Paris"}')]),  # JSON, but not a call
]


@pytest.mark.parametrize("text,want", LLAMA3)
@pytest.mark.parametrize("pieces", [0, 5, 1000])
def test_llama3_json_calls_and_content(text, want, pieces):
    assert run(Llama3JsonParser(), text, pieces) == want


REQUIRED = '[{"name": "f", "parameters": {"a": "x}{\\"", "b": [1, {"c": {}}]}}, {"name": "g", "parameters": {}}]'


@pytest.mark.parametrize("pieces", [0, 4, 9, 1000])
def test_forced_calls_stream_name_first_then_argument_pieces(pieces):
    assert run(ForcedCallParser("f"), '{"a": [1, {"b": null}]}', pieces) == \
        [("call_head", "f"), ("call_args", '{"a": [1, {"b": null}]}')]
    assert run(ForcedCallParser(), REQUIRED, pieces) == [
        ("call_head", "f"), ("call_args", '{"a": "x}{\\"", "b": [1, {"c": {}}]}'), ("call_head", "g"),
        ("call_args", "{}")]


def test_forced_calls_cut_by_max_tokens_are_still_calls():
    assert run(ForcedCallParser("f"), '{"a": [1, ', 2) == [("call_head", "f"), ("call_args", '{"a": [1, ')]
    args = REQUIRED.index('{"a"')
    assert run(ForcedCallParser(), REQUIRED[:60], 3) == [("call_head", "f"), ("call_args", REQUIRED[args:60])]
    assert run(ForcedCallParser(), '[{"name": "f', 3) == [("content", '[{"name": "f')]  # no name yet: no call


REASONING = [
    ("qwen3", "<think>\nStep 1.\n</think>\n\nThe answer is 4.", [("reasoning", "\nStep 1.\n"),
                                                                 ("content", "The answer is 4.")]),
    ("qwen3", "The answer is 4.", [("content", "The answer is 4.")]),
    ("qwen3", "  <thin", [("content", "  <thin")]),
    ("qwen3", "<think>never closed </thi", [("reasoning", "never closed </thi")]),
    ("deepseek_r1", "Let me think. a</b>c\n</think>\n\nFour.", [("reasoning", "Let me think. a</b>c\n"),
                                                               ("content", "Four.")]),
    ("deepseek_r1", "cut off", [("reasoning", "cut off")]),
    ("deepseek_r1", "done</think>\n\n", [("reasoning", "done")]),
]


@pytest.mark.parametrize("name,text,want", REASONING)
@pytest.mark.parametrize("pieces", [0, 4, 1000])
def test_reasoning_split(name, text, want, pieces):
    assert run(ReasoningParser(name), text, pieces) == want


@pytest.mark.parametrize("pieces", [0, 7, 1000])
def test_reasoning_then_tool_calls_streamed_equal_the_whole_message(pieces):
    text = ('<think>\nThe user wants weather; call the tool.\n</think>\n\nChecking.\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    whole = ChatOutputParser("qwen3", make_tool_parser("hermes"))
    whole.feed(text, final=True)
    msg = whole.message()
    assert msg["reasoning_content"] == "\nThe user wants weather; call the tool.\n"
    assert msg["content"] == "Checking."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == \
        [("get_weather", {"city": "Paris"})]
    assert whole.finish_reason("stop") == "tool_calls" and whole.finish_reason("length") == "length"
    streamed = ChatOutputParser("qwen3", make_tool_parser("hermes"))
    rng = random.Random(pieces)
    cuts = sorted(rng.sample(range(1, len(text)), min(pieces, len(text) - 1)))
    deltas = []
    for i, (a, b) in enumerate(zip([0] + cuts, cuts + [len(text)])):
        for e in streamed.feed(text[a:b], final=i == len(cuts)):
            deltas += streamed.delta(e)
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert content == msg["content"] and reasoning == msg["reasoning_content"]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"].startswith("call_")
    assert "".join(c["function"]["arguments"] for c in calls) == msg["tool_calls"][0]["function"]["arguments"]


def test_parser_detected_from_the_chat_template():
    assert detect_tool_parser("{% for t in tools %}<tool_call>{{ t }}</tool_call>{% endfor %}") == "hermes"
    assert detect_tool_parser("<|start_header_id|>ipython<|end_header_id|> \"parameters\" <|python_tag|>") == \
        "llama3_json"
    assert detect_tool_parser("{{ messages }}") is None and detect_tool_parser(None) is None
    with pytest.raises(ValueError, match="unknown tool call parser"):
        make_tool_parser("mistral")


def test_a_prompt_that_closed_the_reasoning_leaves_the_answer_to_the_content():
    for name in ("qwen3", "deepseek_r1"):
        assert run(ReasoningParser(name, closed=True), "\n\nAll content </think> here.", 3) == \
            [("content", "\n\nAll content </think> here.")]


def test_a_template_that_fails_on_the_messages_is_a_chat_template_error():
    """A template's own Python error (here '+' on a missing content) is refused as the messages' problem (the
    server's 400), not an internal error."""
    from rtp_llm.errors import ChatTemplateError
    from rtp_llm.tokenizer.chat_template import render

    with pytest.raises(ChatTemplateError, match="TypeError"):
        render("{% for m in messages %}{{ '<' + m['content'] }}{% endfor %}", [{"role": "user", "content": None}])


# Real answers to "What is the weather like in Paris today?" with a get_weather tool and tool_choice auto, greedy,
# recorded with rtp-llm on the installable models (the Qwen2.5-Coder GGUF of benchmarks/peers/setup_qwen_coder.sh
# through its own Hermes template; SmolLM2 through rtp-llm's ChatML tool template).
QWEN_CODER_0_5B = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
SMOLLM2_135M = ("The weather in Paris today is quite unusual. The city is known for its extreme weather conditions, "
                "with a high of 28.3\u00b0C (83.7\u00b0F) and a low of 18.4\u00b0C (64.9\u00b0F).")


@pytest.mark.parametrize("pieces", [0, 3, 17, 1000])
def test_real_models_answers_parse_as_the_model_meant(pieces):
    from rtp_llm.tokenizer.tool_parsers import BareJsonCalls

    got = run(BareJsonCalls(HermesParser(), ["get_weather"]), QWEN_CODER_0_5B, pieces)
    assert got == [("call", ToolCall("get_weather", json.dumps({"city": "Paris", "unit": "celsius"})))]
    assert run(BareJsonCalls(HermesParser(), ["get_weather"]), SMOLLM2_135M, pieces) == [("content", SMOLLM2_135M)]
    # a JSON answer naming no declared tool is the model's content, whole
    assert run(BareJsonCalls(HermesParser(), ["get_time"]), QWEN_CODER_0_5B, pieces) == [("content", QWEN_CODER_0_5B)]
