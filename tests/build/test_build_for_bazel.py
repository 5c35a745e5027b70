"""aclnn_custom_ops/build_for_bazel.sh against fake CANN trees with stand-in bisheng and cmake: the
discovery order, the error messages when pieces are missing, and where the outputs land. Also
shellcheck-clean."""

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "aclnn_custom_ops" / "build_for_bazel.sh"

# A stand-in cmake: records its arguments, and for --install lays out what CANN's flow installs.
FAKE_CMAKE = r"""#!/usr/bin/env bash
echo "cmake $*" >> "$CMAKE_LOG"
echo "env FAKE_CANN_ENV=${FAKE_CANN_ENV:-unset}" >> "$CMAKE_LOG"
if [ "$1" = "--install" ]; then
  prefix=$(grep -o 'CMAKE_INSTALL_PREFIX=[^ ]*' "$CMAKE_LOG" | head -1 | cut -d= -f2)
  v="$prefix/vendors/customize"
  mkdir -p "$v/op_api/lib" "$v/op_proto/lib/linux/x86_64" "$v/op_impl/ai_core/tbe/op_tiling/lib/linux/x86_64"
  [ -n "${SKIP_OPAPI:-}" ] || echo opapi > "$v/op_api/lib/libcust_opapi.so"
  echo proto > "$v/op_proto/lib/linux/x86_64/libcust_opsproto_rt2.0.so"
  echo master > "$v/op_impl/ai_core/tbe/op_tiling/lib/linux/x86_64/libcust_opmaster_rt2.0.so"
fi
"""


def fake_cann(root: Path, bisheng=True, env_file=True, marker="toolkit") -> Path:
    (root / "compiler" / "ccec_compiler" / "bin").mkdir(parents=True)
    if env_file:
        (root / "set_env.sh").write_text(f"export FAKE_CANN_ENV={marker}\n")
    if bisheng:
        b = root / "compiler" / "ccec_compiler" / "bin" / "bisheng"
        b.write_text("#!/bin/sh\nexit 0\n")
        b.chmod(0o755)
    (root / "opp").mkdir()
    return root


def run(tmp_path, env_over, ops="apply_top_k_top_p_custom", with_cmake=True):
    # PATH holds only the utilities the script uses (so the system cmake cannot stand in) + the fakes.
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for util in ("dirname", "find", "tar", "cp", "mkdir", "nproc", "grep", "head", "cut", "cat", "env", "sh",
                 "bash", "chmod"):
        if not (tools / util).exists():
            (tools / util).symlink_to(shutil.which(util))
    if with_cmake and not (tools / "cmake").exists():
        (tools / "cmake").write_text(FAKE_CMAKE)
        (tools / "cmake").chmod(0o755)
    env = {"PATH": str(tools), "CMAKE_LOG": str(tmp_path / "cmake.log"), "HOME": str(tmp_path)}
    env.update(env_over)
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(SCRIPT), str(out), ops, "ascend910b"], env=env, capture_output=True, text=True,
                         timeout=60)
    log = (tmp_path / "cmake.log").read_text() if (tmp_path / "cmake.log").exists() else ""
    return res, out, log


def test_builds_and_collects_outputs(tmp_path):
    cann = fake_cann(tmp_path / "home")
    res, out, log = run(tmp_path, {"ASCEND_HOME_PATH": str(cann)})
    assert res.returncode == 0, res.stderr
    for lib in ("libcust_opapi.so", "libcust_opsproto_rt2.0.so", "libcust_opmaster_rt2.0.so"):
        assert (out / "lib" / lib).is_file()
    with tarfile.open(out / "opp.tar") as tar:
        assert "customize/op_api/lib/libcust_opapi.so" in tar.getnames()
    assert f"-DASCEND_CANN_PACKAGE_PATH={cann}" in log
    assert "-DASCEND_COMPUTE_UNIT=ascend910b" in log and "-DASCEND_OPS=apply_top_k_top_p_custom" in log
    assert "FAKE_CANN_ENV=toolkit" in log  # CANN's environment was sourced before cmake ran


def test_discovery_order(tmp_path):
    home = fake_cann(tmp_path / "home", marker="home")
    opp_toolkit = fake_cann(tmp_path / "tk", marker="opp")
    # ASCEND_HOME_PATH wins over ASCEND_OPP_PATH
    res, _, log = run(tmp_path, {"ASCEND_HOME_PATH": str(home), "ASCEND_OPP_PATH": str(opp_toolkit / "opp")})
    assert res.returncode == 0 and f"CANN at {home}" in res.stdout
    # without it, ASCEND_OPP_PATH's toolkit
    (tmp_path / "cmake.log").unlink()
    res, _, log = run(tmp_path, {"ASCEND_OPP_PATH": str(opp_toolkit / "opp")})
    assert res.returncode == 0 and f"CANN at {opp_toolkit}" in res.stdout and "FAKE_CANN_ENV=opp" in log


def test_missing_cann_names_what_was_tried(tmp_path):
    res, _, _ = run(tmp_path, {"ASCEND_HOME_PATH": str(tmp_path / "nope"), "ASCEND_OPP_PATH": str(tmp_path / "x/opp")})
    assert res.returncode != 0
    assert "CANN not found" in res.stderr and "ASCEND_HOME_PATH=" in res.stderr and "ASCEND_OPP_PATH=" in res.stderr
    assert "/usr/local/Ascend/ascend-toolkit/latest" in res.stderr


@pytest.mark.parametrize("case,needle", [
    ("no_env", "no set_env.sh"),
    ("no_bisheng", "bisheng"),
    ("no_cmake", "cmake not found"),
    ("bad_op", "operator 'no_such_op'"),
    ("no_output", "no libcust_opapi.so"),
])
def test_missing_pieces(tmp_path, case, needle):
    cann = fake_cann(tmp_path / "home", bisheng=case != "no_bisheng", env_file=case != "no_env")
    env = {"ASCEND_HOME_PATH": str(cann)}
    if case == "no_output":
        env["SKIP_OPAPI"] = "1"
    res, _, _ = run(tmp_path, env, ops="no_such_op" if case == "bad_op" else "apply_top_k_top_p_custom",
                    with_cmake=case != "no_cmake")
    assert res.returncode != 0 and needle in res.stderr, res.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean():
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
