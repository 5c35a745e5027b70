"""python -m rtp_llm.doctor on this machine's CPU: the device checks and the preflight of the default model pass (the
/dev/shm line as large as /dev/shm really is), and each failing check says what it saw and the fix: a /dev/shm below
the minimum, a memory plan beyond the host, a tensor-parallel split the heads do not allow, a bad flag."""

import json
import shutil

from rtp_llm.doctor import FAIL, PASS, run
from rtp_llm.doctor.__main__ import main
from rtp_llm.doctor.checks import GiB, SHM_MIN, check_shm
from tests.models.tiny_checkpoints import make_checkpoint


def by_name(checks):
    return {c.name: c for c in checks}


def test_the_cpu_checks_and_the_default_models_preflight_pass():
    code, checks = run(["--device", "cpu"])
    got = by_name(checks)
    shm_ok = shutil.disk_usage("/dev/shm").total >= SHM_MIN
    assert got["/dev/shm"].status == (PASS if shm_ok else FAIL)
    others = [c for c in checks if c.name != "/dev/shm"]
    assert all(c.status == PASS for c in others), [c for c in others if c.status != PASS]
    assert code == (0 if shm_ok else 1)
    assert {"torch", "rtp-llm kernels", "cpu", "cpu operator", "model", "dtype", "kernel shapes", "block size",
            "weight formats", "tensor parallel", "memory", "generate"} <= set(got)
    assert "2 greedy tokens on the cpu" in got["generate"].detail
    assert "Q4_1" in got["weight formats"].detail and "Q8_0" in got["weight formats"].detail


def test_a_small_dev_shm_fails_with_its_fix():
    size = shutil.disk_usage("/dev/shm").total
    c = check_shm(minimum=size + GiB)
    assert c.status == FAIL and "below" in c.detail and "--shm-size" in c.fix
    assert check_shm(minimum=1).status == PASS
    missing = check_shm(path="/no/such/shm")
    assert missing.status == FAIL and "--shm-size" in missing.fix


def test_a_memory_plan_beyond_the_host_fails_before_loading():
    code, checks = run(["--device", "cpu", "--kv_cache_memory_gb", "100000", "--no_generate"])
    mem = by_name(checks)["memory"]
    assert code == 1 and mem.status == FAIL and "GiB" in mem.detail
    assert "kv_cache_memory_gb" in mem.fix
    assert "generate" not in by_name(checks)  # nothing was loaded


def test_a_split_the_heads_do_not_allow_fails(tmp_path):
    make_checkpoint(tmp_path, "qwen3_gqa2_headdim32_untied")  # 4 heads, 2 KV heads
    code, checks = run(["--device", "cpu", "--model", str(tmp_path), "--tp_size", "3", "--no_generate"])
    tp = by_name(checks)["tensor parallel"]
    assert code == 1 and tp.status == FAIL and "num_key_value_heads=2" in tp.detail and tp.fix


def test_a_bad_flag_and_the_json_output(capsys):
    code, checks = run(["--device", "cpu", "--max_num_seqs", "many"])
    assert code == 2 and checks[0].name == "flags" and "max_num_seqs" in checks[0].detail
    assert main(["--device", "cpu", "--no_generate", "--json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"ok", "checks"} and all(set(c) == {"name", "status", "detail", "fix"}
                                                    for c in report["checks"])
