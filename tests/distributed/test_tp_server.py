"""Tensor parallelism through the HTTP server (real processes, gloo on CPU): `--tp_size 2` answers exactly as
one rank does; a torchrun-style launch (one command per rank, as on several machines) works; a worker that
dies or hangs makes the server exit with a message naming its rank instead of hanging."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import openai
import pytest

from tests.server.server_process import ServerProcess, free_port, kill_during_stream, process_alive, wait_exit

COMMON = ("--max_model_len", "1024", "--kv_cache_memory_gb", "0.25", "--max_num_seqs", "16")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three primary colours are"]
CHAT = [{"role": "user", "content": "Name a large ocean."}]


@pytest.fixture(scope="module")
def reference():
    """One rank, in process: the texts every tensor-parallel launch must reproduce."""
    from rtp_llm import LLM, SamplingParams

    with LLM(kv_cache_memory_gb=0.25, max_model_len=1024) as llm:
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        texts = [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        chat = llm.chat(CHAT, SamplingParams(max_tokens=24, temperature=0), use_tqdm=False)[0].outputs[0].text
    return texts, chat


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _answers(srv):
    client = _client(srv)
    model = client.models.list().data[0].id
    comp = client.completions.create(model=model, prompt=PROMPTS, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True})
    texts = [c.text for c in sorted(comp.choices, key=lambda c: c.index)]
    stream = client.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0, stream=True)
    chat = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    return texts, chat


def _worker_pid(srv) -> int:
    found = re.search(r"workers rank 1 pid (\d+)", srv.output())
    assert found, srv.output()[-2000:]
    return int(found.group(1))


def test_tp2_server_answers_like_one_rank_and_stops_its_worker(reference):
    srv = ServerProcess(*COMMON, "--tp_size", "2")
    try:
        worker = _worker_pid(srv)
        assert process_alive(worker)
        assert _answers(srv) == reference
    finally:
        code = srv.stop()
    assert code == 0, srv.output()[-3000:]
    deadline = time.monotonic() + 30
    while process_alive(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not process_alive(worker), "the worker outlived the server"


def test_torchrun_style_launch_one_command_per_rank(reference):
    """What several machines do: each rank runs the same command with torchrun's variables."""
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    rank1 = subprocess.Popen([sys.executable, "-m", "rtp_llm.start_server", *COMMON, "--tp_size", "2"],
                             env=dict(env, RANK="1", LOCAL_RANK="1"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        srv = ServerProcess(*COMMON, "--tp_size", "2", env={k: env[k] for k in (
            "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} | {"RANK": "0", "LOCAL_RANK": "0"})
        try:
            assert _answers(srv) == reference
        finally:
            code = srv.stop()
        assert code == 0, srv.output()[-3000:]
        assert wait_exit(rank1) == 0  # rank 0's stop message ends rank 1 cleanly
    finally:
        if rank1.poll() is None:
            rank1.kill()
    assert "tensor-parallel rank 1/2 ready" in rank1.stdout.read()


def test_torchrun_launch(reference):
    """torchrun hosts the rendezvous store itself (its agent store); both ranks join it."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "rtp_llm.start_server", *COMMON, "--tp_size", "2", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        srv = SimpleNamespace(url=f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(srv.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert _answers(srv) == reference
    finally:
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc)


def test_killing_a_worker_mid_request_stops_the_server_naming_the_rank():
    srv = ServerProcess(*COMMON, "--tp_size", "2")
    worker = _worker_pid(srv)
    stream, code, out = kill_during_stream(srv, worker, "worker")
    assert code == 1, out[-3000:]
    assert re.search(r"tensor-parallel worker rank 1 \(pid \d+\) died: signal SIGKILL", out), out[-3000:]
    # The cut-short stream ends with an OpenAI-style error event (the client raises it), naming the rank.
    assert len(stream.errors) == 1 and isinstance(stream.errors[0], openai.APIError), stream.errors
    assert "rank 1" in str(stream.errors[0]), stream.errors[0]
    assert not stream.finished_normally


def test_a_hung_worker_is_caught_by_its_heartbeat():
    srv = ServerProcess(*COMMON, "--tp_size", "2", "--tp_heartbeat_timeout", "3")
    worker = _worker_pid(srv)
    os.kill(worker, signal.SIGSTOP)
    try:
        code = wait_exit(srv.proc)
    finally:
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out = srv.output()
    assert code == 1, out[-3000:]
    assert "tensor-parallel worker rank 1 stopped answering (no heartbeat for 3 s)" in out, out[-3000:]
