"""Starts `python -m rtp_llm.start_server` as a real process on a free localhost port; helpers for tests that
load, stop or break it (a request in flight, a long stream read in the background, process checks)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_server(model: str, *flags: str) -> "ServerProcess":
    """A server on a tiny checkpoint (conftest's tiny_model) read with the embedded model's tokenizer, served as
    "tiny"."""
    from rtp_llm.models.default_model import default_model_path

    return ServerProcess("--model", model, "--tokenizer_path", default_model_path(), "--max_model_len", "512",
                         "--kv_cache_memory_gb", "0.1", "--served_model_name", "tiny", *flags)


class ServerProcess:
    def __init__(self, *args: str, env: dict | None = None, timeout: float = 180, new_session: bool = False):
        """new_session: the server leads a process group of its own (what a terminal gives it), so a test
        can signal the whole group as Ctrl-C does."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "rtp_llm.start_server", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=new_session)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server did not become healthy in {timeout}s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        """Sends sig (None: none, the process is already stopping) and waits; kills it after timeout."""
        if self.proc.poll() is None:
            if sig is not None:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def process_alive(pid: int) -> bool:
    """True while pid runs (a zombie, which has exited but not been reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


class BackgroundStream:
    """A long streamed completion (900 tokens, EOS ignored) read on a thread through the openai client, for
    tests that break the server under it: the stream must end (an error event, a closed connection), not hang."""

    def __init__(self, url: str):
        import openai

        self.chunks: list = []
        self.errors: list = []
        self._client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        self._thread = threading.Thread(target=self._consume, daemon=True)
        self._thread.start()

    def _consume(self) -> None:
        client = self._client
        try:
            for ch in client.completions.create(model=client.models.list().data[0].id, prompt="Once upon a time",
                                                max_tokens=900, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True}):
                self.chunks.append(ch)
        except Exception as exc:  # noqa: BLE001 - what the test inspects
            self.errors.append(exc)

    def wait_for_chunks(self, n: int, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.chunks) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.chunks) >= n

    def ended(self, timeout: float = 30) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def finished_normally(self) -> bool:
        return any(c.choices and c.choices[0].finish_reason for c in self.chunks)


class LongRequest:
    """A 60-token completion posted on a thread (a request in flight while the test stops the server)."""

    def __init__(self, url: str):
        self.result: dict = {}
        self._thread = threading.Thread(target=self._post, args=(url,))
        self._thread.start()

    def _post(self, url: str) -> None:
        r = httpx.post(url + "/v1/completions", json={"prompt": "Once", "max_tokens": 60, "ignore_eos": True},
                       timeout=180)
        self.result["status"], self.result["body"] = r.status_code, r.json()

    def join(self, timeout: float = 60) -> dict:
        self._thread.join(timeout)
        return self.result


def wait_exit(proc: subprocess.Popen, limit: float = 90) -> int:
    """The test's patience, not a performance bound: a hang fails here instead of blocking CI."""
    try:
        return proc.wait(limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"process {proc.pid} still running after {limit}s")


def kill_during_stream(srv: ServerProcess, pid: int, what: str,
                       sig: int = signal.SIGKILL) -> tuple[BackgroundStream, int, str]:
    """Sends `sig` (SIGKILL) to `pid` (a process serving `srv`) while a long stream is open; returns the stream
    (ended: a hang fails here), the server's exit code and its output. `what` names the process in the failure."""
    stream = BackgroundStream(srv.url)
    assert stream.wait_for_chunks(3), srv.output()[-2000:]
    os.kill(pid, sig)
    code = wait_exit(srv.proc)
    assert stream.ended(30), f"the client stream hung after the {what} died"
    return stream, code, srv.output()
