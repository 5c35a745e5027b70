"""The API docs' structured-output and tool-call examples, read from docs/api.md and run as a user would paste them,
against a real server on the embedded model: what they print is what the README says they print."""

import json
import re
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parents[2]


def _section_python(title: str) -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n#", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, f"one python example under '{title}'"
    return blocks[0]


def test_structured_output_and_tool_call_examples_run_as_pasted(server, capsys):
    ns: dict = {}
    for title in ("Structured outputs", "Tool calls"):
        code = _section_python(title).replace("http://127.0.0.1:8000", server.url)
        exec(compile(code, f"docs/api.md ({title})", "exec"), ns)  # noqa: S102 - the README's own example
    printed = capsys.readouterr().out.splitlines()
    jsonschema.validate(json.loads(printed[0]), ns["schema"])           # the json_schema answer
    assert ns["r"].choices[0].message.tool_calls[0].function.name == "get_weather"
    assert printed[1].startswith("get_weather ") and isinstance(json.loads(printed[1].split(" ", 1)[1])["city"], str)
    assert ns["msgs"][-1]["role"] == "tool" and printed[2:]  # the answer after the tool result
