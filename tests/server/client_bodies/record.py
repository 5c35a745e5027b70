"""Records the request bodies real client libraries send (the openai SDK, the OpenAI Agents SDK, instructor,
LangChain, pydantic-ai, LlamaIndex, LiteLLM) into bodies.json, for test_client_libraries.py to send to real servers.
Not a test: run it by hand in a venv holding the libraries (none of them is a test dependency):

    python -m venv /tmp/libvenv && /tmp/libvenv/bin/pip install openai-agents instructor langchain-openai \\
        "pydantic-ai-slim[openai]" llama-index-llms-openai-like litellm
    /tmp/libvenv/bin/python tests/server/client_bodies/record.py [openai instructor langchain pydantic-ai agents \\
        llamaindex litellm]

A local stub server answers each request with a minimal valid reply and keeps the body; each library is driven as
its documentation shows, with the tools and output types of a weather agent."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from pydantic import BaseModel

BODIES: list[tuple[str, str, dict]] = []  # (library use, path, body)
CURRENT = ["?"]


def _reply(path: str, body: dict) -> dict:
    """A call of the first tool while the conversation holds no tool result (so an agent runs it and sends the
    result back: the second body), else the final answer."""
    if path.endswith("/responses"):
        answered = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in body["input"])
        out = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [
            {"type": "output_text", "text": '{"city": "Paris", "temperature_c": 21}', "annotations": []}]}
        if body.get("tools") and not answered:
            out = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": body["tools"][0]["name"],
                   "arguments": '{"city": "Paris"}', "status": "completed"}
        return {"id": "resp_1", "object": "response", "created_at": int(time.time()), "status": "completed",
                "model": body.get("model", "m"), "output": [out],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "usage": {
                    "input_tokens": 1, "output_tokens": 1, "total_tokens": 2, "input_tokens_details": {
                        "cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    msg = {"role": "assistant", "content": '{"city": "Paris", "temperature_c": 21}'}
    choice = body.get("tool_choice")
    answered = any(m.get("role") == "tool" for m in body["messages"])
    if body.get("tools") and choice in (None, "auto") and not answered and body.get("response_format"):
        msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": body["tools"][0]["function"]["name"], "arguments": '{"city": "Paris"}'}}]}
    if isinstance(choice, dict):
        msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": choice["function"]["name"], "arguments": '{"city": "Paris", "temperature_c": 21}'}}]}
    return {"id": "c1", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class Stub(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the stdlib's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        BODIES.append((CURRENT[0], self.path, body))
        if body.get("stream"):
            self.send_response(500)
            self.end_headers()
            return
        data = json.dumps(_reply(self.path, body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Weather(BaseModel):
    city: str
    temperature_c: int


def get_weather(city: str) -> str:
    """Current weather in a city."""
    return "21 C"


def attempt(name, fn):
    CURRENT[0] = name
    try:
        fn()
    except Exception as exc:  # the stub's reply need not satisfy every library: the body is what counts
        print(f"{name}: {type(exc).__name__}: {str(exc)[:120]}")


def record_openai(base):
    import openai

    client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
    attempt("openai SDK, arguments passed as None", lambda: client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], temperature=None, top_p=None, n=None, stream=None,
        logprobs=None, presence_penalty=None, frequency_penalty=None, parallel_tool_calls=None))


def record_instructor(base):
    import instructor
    import openai

    client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
    attempt("instructor, TOOLS mode", lambda: instructor.from_openai(client).chat.completions.create(
        model="m", response_model=Weather, max_retries=0, messages=[{"role": "user", "content": "Weather in Paris?"}]))
    attempt("instructor, create_partial (streamed)", lambda: list(instructor.from_openai(client).chat.completions
                                                                  .create_partial(model="m", response_model=Weather,
                                                                                  max_retries=0, messages=[
                                                                      {"role": "user", "content": "Paris?"}])))


def record_langchain(base):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base, api_key="x", model="m", max_retries=0)
    attempt("LangChain bind_tools", lambda: llm.bind_tools([get_weather]).invoke("Weather in Paris?"))
    attempt("LangChain with_structured_output", lambda: llm.with_structured_output(Weather).invoke("Paris?"))


def record_pydantic_ai(base):
    from pydantic_ai import Agent as PAgent
    from pydantic_ai import NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=base, api_key="x"))
    attempt("pydantic-ai NativeOutput with tools", lambda: PAgent(
        model, output_type=NativeOutput(Weather), tools=[get_weather]).run_sync("Weather in Paris?"))


def record_agents(base):
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    aclient = openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0)
    tool = function_tool(get_weather)
    for label, m in (("Agents SDK, Responses model", OpenAIResponsesModel("m", aclient)),
                     ("Agents SDK, chat completions model", OpenAIChatCompletionsModel("m", aclient))):
        attempt(f"{label}, tools + output_type", lambda m=m: Runner.run_sync(
            Agent(name="weather", instructions="Answer about weather.", model=m, tools=[tool], output_type=Weather),
            "Weather in Paris?"))


def record_llamaindex(base):
    # OpenAILike: LlamaIndex's class for OpenAI-compatible servers (its OpenAI class accepts OpenAI's model names only)
    from llama_index.core.llms import ChatMessage
    from llama_index.core.prompts import PromptTemplate
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model="m", api_base=base, api_key="x", is_chat_model=True, is_function_calling_model=True,
                     max_retries=0)
    attempt("LlamaIndex chat", lambda: llm.chat([ChatMessage(role="user", content="Hi")]))
    attempt("LlamaIndex stream_chat", lambda: list(llm.stream_chat([ChatMessage(role="user", content="Hi")])))
    attempt("LlamaIndex predict_and_call", lambda: llm.predict_and_call(
        [FunctionTool.from_defaults(fn=get_weather)], "Weather in Paris?"))
    attempt("LlamaIndex structured_predict", lambda: llm.structured_predict(
        Weather, PromptTemplate("Weather in {city}?"), city="Paris"))


def record_litellm(base):
    import litellm

    kw = dict(model="openai/m", api_base=base, api_key="x", num_retries=0)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    attempt("LiteLLM completion with tools", lambda: litellm.completion(messages=ask, tools=tools, **kw))
    attempt("LiteLLM completion, response_format a pydantic model", lambda: litellm.completion(
        messages=ask, response_format=Weather, **kw))
    attempt("LiteLLM completion, streamed", lambda: list(litellm.completion(messages=ask, stream=True, **kw)))


LIBRARIES = {"openai": ("openai SDK", record_openai), "instructor": ("instructor", record_instructor),
             "langchain": ("LangChain", record_langchain), "pydantic-ai": ("pydantic-ai", record_pydantic_ai),
             "agents": ("Agents SDK", record_agents), "llamaindex": ("LlamaIndex", record_llamaindex),
             "litellm": ("LiteLLM", record_litellm)}


def main() -> None:
    """record.py [LIBRARY ...]: drives the named libraries (all without names) and replaces their bodies in
    bodies.json, keeping the others'."""
    names = sys.argv[1:] or list(LIBRARIES)
    server = HTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/v1"
    for name in names:
        LIBRARIES[name][1](base)
    server.shutdown()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bodies.json")
    labels = tuple(LIBRARIES[n][0] for n in names)
    kept = []
    if os.path.exists(out):
        with open(out) as f:
            kept = [b for b in json.load(f) if not b["use"].startswith(labels)]
    with open(out, "w") as f:
        json.dump(kept + [{"use": u, "path": p, "body": b} for u, p, b in BODIES], f, indent=1)
    print(f"{len(BODIES)} bodies of {', '.join(names)} -> {out}")


if __name__ == "__main__":
    main()
