"""The server on the emulated NPU (a real process with the emulator as torch_npu), in bfloat16: through the OpenAI
API its greedy answer agrees with the CPU server's in bfloat16 under the bf16 rule of test_npu_engine.py (the same
tokens up to the first difference, which must sit at a near tie of the NPU's own top logprobs)."""

import os

import httpx

from tests.npu_emulator.install import env_for_subprocess
from tests.server.server_process import ServerProcess

BODY = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
        "temperature": 0, "logprobs": True, "top_logprobs": 2}
MARGIN_ULPS, BF16_REL = 4, 2.0 ** -8


def test_server_on_npu_answers_like_cpu_in_bf16():
    answers = {}
    for device, extra in (("npu", ("--num_blocks", "12")), ("cpu", ("--dtype", "bfloat16"))):
        env = env_for_subprocess(os.environ) if device == "npu" else dict(os.environ)
        srv = ServerProcess("--device", device, "--max_model_len", "512", "--kv_cache_memory_gb", "0.1", *extra,
                            env=env)
        try:
            if device == "npu":
                assert "device npu" in srv.output() and "run in bfloat16" in srv.output()
            r = httpx.post(srv.url + "/v1/chat/completions", json=BODY, timeout=300)
            assert r.status_code == 200, r.text
            answers[device] = r.json()["choices"][0]["logprobs"]["content"]
        finally:
            assert srv.stop() == 0
    npu, cpu = answers["npu"], answers["cpu"]
    assert npu and cpu
    for a, b in zip(npu, cpu):
        if a["token"] != b["token"]:
            top = {t["token"]: t["logprob"] for t in a["top_logprobs"]}
            gap = a["logprob"] - top.get(b["token"], min(top.values()))
            assert gap <= MARGIN_ULPS * BF16_REL * max(abs(a["logprob"]), 1.0), (a, b)
            break
