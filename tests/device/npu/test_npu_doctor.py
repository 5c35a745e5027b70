"""python -m rtp_llm.doctor --device npu on the emulated NPU: it names the emulator for what it is, finds CANN's
environment, initialises the device, checks one operator against the CPU and runs the default model's preflight and
a generate; a missing CANN environment, a head dim the fused attention refuses and --dtype float16 each fail with
their fix."""

from tests.npu_emulator.install import install

install()

from rtp_llm.doctor import FAIL, PASS, WARN, run  # noqa: E402
from tests.models.tiny_checkpoints import make_checkpoint  # noqa: E402


def by_name(checks):
    return {c.name: c for c in checks}


def fake_cann(tmp_path, monkeypatch):
    home = tmp_path / "ascend-toolkit" / "latest"
    home.mkdir(parents=True)
    (home / "version.cfg").write_text("runtime_running_version=[9.1.0:Emulated]\n")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(home))
    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH", raising=False)
    return home


def test_the_emulated_npu_passes_with_the_emulator_named(tmp_path, monkeypatch):
    fake_cann(tmp_path, monkeypatch)
    code, checks = run(["--device", "npu", "--block_size", "128"])
    got = by_name(checks)
    assert got["torch_npu"].status == WARN and "emulator" in got["torch_npu"].detail
    assert got["CANN environment"].status == PASS and "9.1.0" in got["CANN environment"].detail
    for name in ("npu device", "npu operator", "dtype", "kernel shapes", "block size", "memory", "generate"):
        assert got[name].status == PASS, got[name]
    assert "bfloat16" in got["dtype"].detail and "on the npu" in got["generate"].detail
    assert got["custom operators"].status == WARN
    assert all(c.status != FAIL for c in checks if c.name != "/dev/shm")


def test_no_cann_environment_fails_with_the_set_env_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    code, checks = run(["--device", "npu", "--no_generate"])
    cann = by_name(checks)["CANN environment"]
    assert code == 1 and cann.status == FAIL and "set_env.sh" in cann.fix


def test_a_head_dim_the_fused_attention_refuses_fails_at_preflight_and_at_load(tmp_path, monkeypatch):
    fake_cann(tmp_path, monkeypatch)
    model = tmp_path / "hd32"
    make_checkpoint(model, "qwen3_gqa2_headdim32_untied")
    code, checks = run(["--device", "npu", "--model", str(model), "--no_generate"])
    shapes = by_name(checks)["kernel shapes"]
    assert code == 1 and shapes.status == FAIL and "head_dim 32" in shapes.detail and "--device cpu" in shapes.fix
    import pytest

    from rtp_llm import LLM
    from rtp_llm.models.default_model import default_model_path

    with pytest.raises(ValueError, match="head_dim 32 is not supported on NPU"):
        LLM(str(model), tokenizer=default_model_path(), device="npu", num_blocks=4)


def test_float16_on_the_npu_fails_with_its_reason(tmp_path, monkeypatch):
    fake_cann(tmp_path, monkeypatch)
    code, checks = run(["--device", "npu", "--dtype", "float16", "--no_generate"])
    dtype = by_name(checks)["dtype"]
    assert code == 1 and dtype.status == FAIL and "bfloat16 only" in dtype.detail and "--dtype auto" in dtype.fix
