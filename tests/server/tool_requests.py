"""The tool requests the server tests share: a Hermes tool template, two tools with strict schemas, a question
that calls for one, and readers of a chat answer's calls (whole and streamed)."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
HERMES = os.path.join(HERE, "templates", "hermes_tools.jinja")
THINKING = os.path.join(HERE, "templates", "thinking.jinja")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def reassemble(stream):
    """A chat stream -> per choice: content, reasoning, tool calls [(id, name, arguments)], finish_reason."""
    out = {}
    for chunk in stream:
        for c in chunk.choices:
            o = out.setdefault(c.index, {"content": "", "reasoning": "", "calls": {}, "finish": None})
            d = c.delta
            o["content"] += d.content or ""
            o["reasoning"] += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                slot = o["calls"].setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            if c.finish_reason:
                o["finish"] = c.finish_reason
    return [out[i] for i in sorted(out)]


def calls_of(message):
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
