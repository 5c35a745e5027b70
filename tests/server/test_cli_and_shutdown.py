"""start_server's flags and environment twins, its one-line errors, and a graceful SIGTERM."""

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from rtp_llm.config.server_args import FLAGS, resolve
from rtp_llm.errors import ConfigError
from tests.server.server_process import LongRequest, ServerProcess, kill_during_stream, process_alive


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
    # More KV cache than the host has: refused before loading, with both sizes and the flags (was: the OOM killer
    # or a failed allocation after the weights were loaded).
    (["--kv_cache_memory_gb", "100000"], {}, "--kv_cache_memory_gb"),
])
def test_start_server_exits_with_a_one_line_error(args, env, needle):
    res = _run(*args, env=env)
    assert res.returncode == 2
    err = [l for l in res.stderr.strip().splitlines() if l.startswith("error:")]
    assert len(err) == 1 and needle in err[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    if "kv_cache_memory_gb" in args:
        assert "GiB available" in err[0] and "Loading weights" not in res.stderr


# Patience for a drain: the 60-token request takes ~2 s on a quiet machine, but Bazel runs two test actions
# at once on 2 cores, and two processes' OpenMP teams on the same cores can stretch a decode step 20-50x
# (each parallel region waits for a descheduled thread): 30 s was seen to run out there.
DRAIN_S = "120"


def test_sigterm_finishes_in_flight_requests_and_exits_zero():
    srv = ServerProcess("--max_model_len", "256", "--kv_cache_memory_gb", "0.05", "--shutdown_timeout", DRAIN_S)
    request = LongRequest(srv.url)
    time.sleep(1.0)  # the request is running
    # stop() kills after 150 s, which would show as -9: exit code 0 means it drained and left by itself.
    code = srv.stop(signal.SIGTERM, timeout=150)
    result = request.join(150)
    assert code == 0, srv.output()[-2000:]
    assert result["status"] == 200 and result["body"]["usage"]["completion_tokens"] == 60
    with pytest.raises(httpx.HTTPError):
        httpx.get(srv.url + "/health", timeout=2)
    assert "did not stop" not in srv.output()  # the engine stopped when asked, not killed


def test_sigint_also_exits_zero():
    srv = ServerProcess("--max_model_len", "128", "--kv_cache_memory_gb", "0.05")
    assert srv.stop(signal.SIGINT) == 0


def test_an_idle_server_stops_its_engine_without_killing_it():
    """The engine process gets Shutdown and exits by itself; the server does not report a timeout it never waited
    (two threads reaping the same process made the second see it alive and kill it 0.3 s after SIGTERM)."""
    for _ in range(3):
        srv = ServerProcess("--max_model_len", "128", "--kv_cache_memory_gb", "0.05")
        pid = _engine_pid(srv)
        assert srv.stop(signal.SIGTERM) == 0
        out = srv.output()
        assert "did not stop" not in out and "killing it" not in out, out[-2000:]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_process_group_still_drains(sig):
    """A terminal's Ctrl-C, systemd's KillMode=control-group, `kill -TERM -PGID` and `timeout` signal every process
    of the group: the engine process must leave stopping to the server, so streamed and non-streamed requests in
    flight finish and the server exits 0 (SIGTERM killed the engine: a 500 and exit 1)."""
    import json
    import threading

    srv = ServerProcess("--max_model_len", "256", "--kv_cache_memory_gb", "0.05", "--shutdown_timeout", DRAIN_S,
                        new_session=True)
    request = LongRequest(srv.url)
    streamed: dict = {"events": []}

    def stream():
        body = {"prompt": "Twice", "max_tokens": 60, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=180) as r:
            streamed["status"] = r.status_code
            streamed["events"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    reader = threading.Thread(target=stream)
    reader.start()
    time.sleep(1.0)
    os.killpg(srv.proc.pid, sig)
    code = srv.stop(None, timeout=150)
    result = request.join(150)
    reader.join(150)
    assert code == 0, srv.output()[-2000:]
    assert result["status"] == 200 and result["body"]["usage"]["completion_tokens"] == 60
    assert streamed["status"] == 200 and streamed["events"][-1] == "data: [DONE]"
    assert json.loads(streamed["events"][-2][6:])["choices"][0]["finish_reason"] == "length"


def _engine_pid(srv) -> int:
    found = re.search(r"engine process pid (\d+)", srv.output())
    assert found, srv.output()[-2000:]
    return int(found.group(1))


def test_engine_process_death_ends_streams_and_stops_the_server():
    """The engine runs in its own process: if it dies, open streams end with an error event (not a hang)
    and the server exits 1 naming how it died, rather than serving 503s forever."""
    srv = ServerProcess("--max_model_len", "1024", "--kv_cache_memory_gb", "0.05")
    engine = _engine_pid(srv)
    stream, code, out = kill_during_stream(srv, engine, "engine")
    assert code == 1, out[-3000:]
    assert f"the engine process (pid {engine}) exited: signal SIGKILL" in out, out[-3000:]
    assert len(stream.errors) == 1 and isinstance(stream.errors[0], openai.APIError), stream.errors
    assert "signal SIGKILL" in str(stream.errors[0]), stream.errors[0]
    assert not stream.finished_normally


def test_a_crashing_engine_leaves_its_python_stack_in_the_log():
    """A fatal signal in the engine (a kernel's SIGSEGV) prints the engine's Python stack before it dies: the log
    names the step that crashed, not only that the engine exited."""
    srv = ServerProcess("--max_model_len", "1024", "--kv_cache_memory_gb", "0.05")
    engine = _engine_pid(srv)
    stream, code, out = kill_during_stream(srv, engine, "engine", signal.SIGSEGV)
    assert code == 1, out[-3000:]
    assert "Fatal Python error: Segmentation fault" in out, out[-3000:]
    assert re.search(r'File ".*rtp_llm/engine/core_loop\.py", line \d+ in run_engine_process', out), out[-3000:]
    assert f"the engine process (pid {engine}) exited: signal SIGSEGV" in out, out[-3000:]
    assert "signal SIGSEGV" in str(stream.errors[0]), stream.errors


def test_killing_the_server_takes_the_engine_process_with_it():
    srv = ServerProcess("--max_model_len", "128", "--kv_cache_memory_gb", "0.05")
    engine = _engine_pid(srv)
    srv.stop(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while process_alive(engine) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(engine), "the engine process outlived a killed server"


def test_listening_beyond_loopback_without_a_key_warns():
    for args, warned in ((("--host", "0.0.0.0"), True), (("--host", "0.0.0.0", "--api_key", "k"), False),
                         ((), False)):
        srv = ServerProcess("--max_model_len", "128", "--kv_cache_memory_gb", "0.05", *args)
        try:
            assert ("without --api_key" in srv.output()) == warned, srv.output()[-1500:]
        finally:
            assert srv.stop() == 0


def test_every_engine_flag_reaches_engine_config_with_engine_configs_default():
    """One table of settings: a flag that configures the engine takes EngineConfig's default and lands in its
    field (a flag typed twice with drifted defaults fails here)."""
    import dataclasses

    from rtp_llm.config.engine_config import EngineConfig
    from rtp_llm.config.server_args import engine_config

    engine_flags = [f for f in FLAGS if f.engine is not None]
    assert {f.engine for f in engine_flags} >= {"model", "max_queue_len", "max_num_seqs", "tp_timeout_s", "device"}
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    cfg = engine_config(resolve([], {}), "cpu")
    for f in engine_flags:
        if f.engine.startswith("device_options."):
            assert cfg.device_options[f.engine.split(".", 1)[1]] == f.default, f.name
        elif f.name != "device":  # "auto" is resolved to the machine's device before the engine sees it
            assert f.default == defaults[f.engine] == getattr(cfg, f.engine), f.name
    # and a value given on the command line reaches the engine's field
    argv = ["--max_queue_len", "7", "--max_num_seqs", "3", "--tp_timeout", "9.5", "--cpu_gemv_weights", "off",
            "--max_logprobs", "-1", "--model", "/m"]
    cfg = engine_config(resolve(argv, {}), "cpu")
    assert (cfg.max_queue_len, cfg.max_num_seqs, cfg.tp_timeout_s, cfg.max_logprobs, cfg.model) == (7, 3, 9.5, -1, "/m")
    assert cfg.device_options == {"cpu_gemv_weights": "off", "cpu_gguf_blocks": "auto", "npu_graph": "on"}
