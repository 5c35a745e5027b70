"""start_server's flags and environment twins, its one-line errors, and a graceful SIGTERM."""

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from rtp_llm.config.server_args import FLAGS, ConfigError, resolve
from tests.server.server_process import ServerProcess


def _run(*args, env=None):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "rtp_llm.start_server", *args], capture_output=True, text=True,
                          env=full, timeout=120)


def test_help_shows_every_flag_with_its_env_twin():
    out = _run("--help").stdout
    for f in FLAGS:
        assert f"--{f.name}" in out and f.env in out
    for env in ("CHECKPOINT_PATH", "MODEL_TYPE", "TOKENIZER_PATH", "MAX_SEQ_LEN", "SEQ_SIZE_PER_BLOCK", "REUSE_CACHE"):
        assert env in out


def test_command_line_wins_over_environment_which_wins_over_default():
    env = {"MAX_SEQ_LEN": "777", "SEQ_SIZE_PER_BLOCK": "32", "REUSE_CACHE": "0"}
    args = resolve(["--max_model_len", "555"], env)
    assert args["max_model_len"] == 555 and args["block_size"] == 32 and args["enable_prefix_caching"] is False
    assert resolve([], {})["block_size"] is None and resolve(["--model", "/x"], {})["checkpoint_path"] == "/x"


@pytest.mark.parametrize("argv,env,needle", [
    (["--max_num_seqs", "lots"], {}, "--max_num_seqs='lots'"),
    ([], {"MAX_SEQ_LEN": "long"}, "MAX_SEQ_LEN='long'"),
    ([], {"REUSE_CACHE": "maybe"}, "REUSE_CACHE='maybe'"),
    (["--dtype", "int4"], {}, "choose one of"),
])
def test_bad_settings_are_one_line_errors(argv, env, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        resolve(argv, env)


@pytest.mark.parametrize("args,env,needle", [
    (["--checkpoint_path", "/no/such/model"], {}, "does not exist"),
    (["--device", "npu"], {}, "--device npu"),
    ([], {"MAX_NUM_SEQS": "x"}, "MAX_NUM_SEQS"),
    ([], {"CHECKPOINT_PATH": "/no/such/dir"}, "/no/such/dir"),
    (["--tp_size", "4"], {}, "tp_size=4 is larger than num_key_value_heads=3"),  # SmolLM2: 3 KV heads
    (["--tp_size", "2"], {"WORLD_SIZE": "2", "RANK": "5", "MASTER_PORT": "1"}, "RANK=5"),
])
def test_start_server_exits_with_a_one_line_error(args, env, needle):
    res = _run(*args, env=env)
    assert res.returncode == 2
    err = [l for l in res.stderr.strip().splitlines() if l.startswith("error:")]
    assert len(err) == 1 and needle in err[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr


def test_sigterm_finishes_in_flight_requests_and_exits_zero():
    srv = ServerProcess("--max_model_len", "256", "--kv_cache_memory_gb", "0.05", "--shutdown_timeout", "30")
    result = {}

    def long_request():
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 60, "ignore_eos": True},
                       timeout=120)
        result["status"], result["body"] = r.status_code, r.json()

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(1.0)  # the request is running
    # stop() kills after 60 s, which would show as -9: exit code 0 means it drained and left by itself.
    code = srv.stop(signal.SIGTERM, timeout=60)
    t.join(60)
    assert code == 0, srv.output()[-2000:]
    assert result["status"] == 200 and result["body"]["usage"]["completion_tokens"] == 60
    with pytest.raises(httpx.HTTPError):
        httpx.get(srv.url + "/health", timeout=2)


def test_sigint_also_exits_zero():
    srv = ServerProcess("--max_model_len", "128", "--kv_cache_memory_gb", "0.05")
    assert srv.stop(signal.SIGINT) == 0
