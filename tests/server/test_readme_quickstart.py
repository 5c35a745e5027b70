"""The README's first command starts the server on the default model, and its curl example gets a
sensible answer. The command and the curl line are read from README.md itself, so the test fails
when the README drifts from what works. (The set-up half of the command is what CI runs first.)"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.server.server_process import free_port

ROOT = Path(__file__).resolve().parents[2]


def _blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_readme_first_command_and_curl_example():
    readme = (ROOT / "README.md").read_text()
    blocks = _blocks(readme)
    first = blocks[0].strip()
    assert first.startswith("bash scripts/setup.sh && "), first
    serve = first.split("&&", 1)[1].strip()
    assert "rtp_llm.start_server" in serve
    curl = next(b for b in blocks if b.strip().startswith("curl") and "/v1/chat/completions" in b)

    port = free_port()
    cmd = serve.replace("python3", sys.executable, 1).split()
    env = dict(os.environ, START_PORT=str(port))  # the README's port may be taken here; its env twin moves it
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        out = subprocess.run(["bash", "-c", curl.replace("8000", str(port))], capture_output=True, text=True,
                             timeout=120)
        answer = json.loads(out.stdout)["choices"][0]["message"]["content"]
        assert "Paris" in answer
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
