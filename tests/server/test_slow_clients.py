"""Streaming clients that stop reading: their requests are aborted after --stream_stall_timeout (their KV blocks
freed while the connection is still open, no FIN), and the server's memory holds one merged output per stream
meanwhile; a client that reads normally is never cut, however long its answer takes."""

import json
import socket
import time

import httpx
import pytest

from tests.server.server_process import ServerProcess


@pytest.fixture(scope="module")
def srv():
    # The embedded model: an answer of a few hundred tokens takes several seconds, longer than the stall limit.
    s = ServerProcess("--max_model_len", "1024", "--kv_cache_memory_gb", "0.5", "--stream_stall_timeout", "2")
    yield s
    assert s.stop() == 0


def running(srv) -> float:
    for line in httpx.get(srv.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("rtp_llm_num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no running gauge")


def test_a_client_that_stops_reading_is_aborted_and_frees_its_blocks(srv):
    # Chat, n = 16 with 20 top logprobs: ~34 KB of events per step, ~17 MB for the answer - far more than the
    # kernel's send buffer (autotuned up to tcp_wmem's max, 4 MB by default) and uvicorn's hold, so the server's
    # sends block long before the answer is done (with ~3 MB of completions events, an autotuned buffer took it all);
    # 16 choices fill it in half the steps of 8 where a step is slow (a CPU whose kernels decode the GGUF slowly)
    body = json.dumps({"messages": [{"role": "user", "content": "Once"}], "max_tokens": 500, "n": 16,
                       "ignore_eos": True, "stream": True, "logprobs": True, "top_logprobs": 20,
                       "temperature": 1.0}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's sends block soon
    sock.connect(("127.0.0.1", srv.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert sock.recv(64).startswith(b"HTTP/1.1 200")  # then never read again, never close
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and "accepted nothing for 2s; aborted" not in srv.output():
            time.sleep(0.2)
        assert "accepted nothing for 2s; aborted" in srv.output(), srv.output()[-2000:]
        for _ in range(50):
            if running(srv) == 0:
                break
            time.sleep(0.2)
        assert running(srv) == 0  # aborted while its connection is still open
    finally:
        sock.close()


def test_a_client_that_reads_is_never_cut(srv):
    events = []
    with httpx.stream("POST", srv.url + "/v1/completions", json={
            "prompt": "Once", "max_tokens": 120, "ignore_eos": True, "stream": True,
            "logprobs": 5}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line)
            time.sleep(0.005)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
