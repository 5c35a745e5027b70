"""The server on the emulated NPU (a real process with the emulator as torch_npu): the same greedy
answer as the CPU path, through the OpenAI API."""

import os

import httpx

from tests.npu_emulator.install import env_for_subprocess
from tests.server.server_process import ServerProcess

BODY = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
        "temperature": 0}


def test_server_on_npu_answers_like_cpu():
    answers = {}
    for device, extra in (("npu", ("--num_blocks", "12")), ("cpu", ())):
        env = env_for_subprocess(os.environ) if device == "npu" else dict(os.environ)
        srv = ServerProcess("--device", device, "--max_model_len", "512", "--kv_cache_memory_gb", "0.1", *extra,
                            env=env)
        try:
            if device == "npu":
                assert "device npu" in srv.output()
            r = httpx.post(srv.url + "/v1/chat/completions", json=BODY, timeout=300)
            assert r.status_code == 200, r.text
            answers[device] = r.json()["choices"][0]["message"]["content"]
        finally:
            assert srv.stop() == 0
    assert answers["npu"] == answers["cpu"] and "Paris" in answers["npu"]
