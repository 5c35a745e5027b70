"""Records the request bodies real client libraries send (the openai SDK, the OpenAI Agents SDK, instructor,
LangChain, pydantic-ai) into bodies.json, for test_client_libraries.py to send to real servers. Not a test: run it
by hand in a venv holding the libraries (none of them is a test dependency):

    python -m venv /tmp/libvenv && /tmp/libvenv/bin/pip install openai-agents instructor langchain-openai \\
        "pydantic-ai-slim[openai]"
    /tmp/libvenv/bin/python tests/server/client_bodies/record.py

A local stub server answers each request with a minimal valid reply and keeps the body; each library is driven as
its documentation shows, with the tools and output types of a weather agent."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

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


def main() -> None:
    server = HTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/v1"
    from pydantic import BaseModel

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

    import openai

    client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
    attempt("openai SDK, arguments passed as None", lambda: client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], temperature=None, top_p=None, n=None, stream=None,
        logprobs=None, presence_penalty=None, frequency_penalty=None, parallel_tool_calls=None))

    import instructor

    attempt("instructor, TOOLS mode", lambda: instructor.from_openai(client).chat.completions.create(
        model="m", response_model=Weather, max_retries=0, messages=[{"role": "user", "content": "Weather in Paris?"}]))

    attempt("instructor, create_partial (streamed)", lambda: list(instructor.from_openai(client).chat.completions
                                                                  .create_partial(model="m", response_model=Weather,
                                                                                  max_retries=0, messages=[
                                                                      {"role": "user", "content": "Paris?"}])))

    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base, api_key="x", model="m", max_retries=0)
    attempt("LangChain bind_tools", lambda: llm.bind_tools([get_weather]).invoke("Weather in Paris?"))
    attempt("LangChain with_structured_output", lambda: llm.with_structured_output(Weather).invoke("Paris?"))

    from pydantic_ai import Agent as PAgent
    from pydantic_ai import NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=base, api_key="x"))
    attempt("pydantic-ai NativeOutput with tools", lambda: PAgent(
        model, output_type=NativeOutput(Weather), tools=[get_weather]).run_sync("Weather in Paris?"))

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
    server.shutdown()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bodies.json")
    with open(out, "w") as f:
        json.dump([{"use": u, "path": p, "body": b} for u, p, b in BODIES], f, indent=1)
    print(f"{len(BODIES)} bodies -> {out}")


if __name__ == "__main__":
    main()
