"""The Bazel configurations: Ascend fails fast and clearly without CANN, analyses and links with a
(fake) CANN tree, and the CPU build skips Ascend-only targets.

These run Bazel themselves, so they run outside `bazel test` (scripts/test.sh runs them after it).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bazel") is None, reason="bazel is not installed")


def bazel(*args, env=None, timeout=600):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(["bazel", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def make_fake_cann(root: Path) -> Path:
    """include/acl/acl.h with the few declarations the bridge uses + an empty libascendcl.so."""
    (root / "include" / "acl").mkdir(parents=True)
    (root / "lib64").mkdir()
    (root / "include" / "acl" / "acl.h").write_text(
        "#pragma once\n#include <stdint.h>\n"
        "typedef int aclError;\n#define ACL_SUCCESS 0\n"
        "#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
        "aclError aclrtGetDeviceCount(uint32_t *count);\n"
        "#ifdef __cplusplus\n}\n#endif\n"
    )
    empty = root / "empty.c"
    empty.write_text("")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(root / "lib64" / "libascendcl.so"), str(empty)], check=True)
    (root / "lib64" / "libhccl.so").symlink_to(root / "lib64" / "libascendcl.so")
    return root


def test_ascend_without_cann_fails_fast_naming_what_is_missing(tmp_path):
    res = bazel("build", "--config=ascend", f"--repo_env=ASCEND_TOOLKIT_PATH={tmp_path}/no-cann", "//...")
    assert res.returncode != 0
    err = res.stderr
    assert "include/acl/acl.h" in err and "lib64/libascendcl.so" in err
    assert "ASCEND_TOOLKIT_PATH" in err
    assert "--config=cpu" in err
    # It fails in the repository rule, before any target is analysed or built (no timing asserted here).
    assert "Analyzed" not in err and "Compiling" not in err


def test_ascend_with_a_fake_cann_tree_analyses_compiles_and_links(tmp_path):
    cann = make_fake_cann(tmp_path / "cann")
    res = bazel("build", "--config=ascend", f"--repo_env=ASCEND_TOOLKIT_PATH={cann}", "//rtp_llm/cpp/ascend/...",
                "//rtp_llm:_C.so")
    assert res.returncode == 0, res.stderr[-3000:]
    out = bazel("info", "--config=ascend", f"--repo_env=ASCEND_TOOLKIT_PATH={cann}", "bazel-bin").stdout.strip()
    lib = Path(out) / "rtp_llm" / "cpp" / "ascend" / "libascend_bridge.so"
    assert lib.exists()
    dynamic = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "libascendcl.so" in dynamic


def test_cpu_build_skips_ascend_only_targets():
    res = bazel("build", "--config=cpu", "//...")
    assert res.returncode == 0, res.stderr[-3000:]
    out = bazel("info", "--config=cpu", "bazel-bin").stdout.strip()
    assert not (Path(out) / "rtp_llm" / "cpp" / "ascend" / "libascend_bridge.so").exists()
    assert (Path(out) / "rtp_llm" / "_C.so").exists()


def test_the_custom_operator_rule_builds_through_bazel_with_cann_outside_the_default_path(tmp_path):
    """The genrule //aclnn_custom_ops:custom_ops_build under --config=ascend, CANN found only through the
    ASCEND_HOME_PATH its set_env.sh exports (no --repo_env): the repository rule finds it, the rule's script gets the
    same path, and CANN's Python tools run under the shell's python3 (PATH kept), not /usr/bin's."""
    from tests.build.test_build_for_bazel import FAKE_BUILD_SH, fake_cann

    cann = make_fake_cann(fake_cann(tmp_path / "opt" / "cann" / "latest", marker="bazel"))
    tools = tmp_path / "tools"
    tools.mkdir()
    log = tmp_path / "tool.log"
    (tools / "cmake").write_text("#!/bin/sh\nexit 0\n")
    (tools / "python3").write_text(f"#!/bin/sh\necho python3-from-PATH \"$@\" >> {log}\nexec {sys.executable} \"$@\"\n")
    for tool in ("cmake", "python3"):
        (tools / tool).chmod(0o755)
    build_sh = tmp_path / "fake_build.sh"
    build_sh.write_text(FAKE_BUILD_SH)
    env = {"ASCEND_HOME_PATH": str(cann), "PATH": f"{tools}:{os.environ['PATH']}"}
    res = bazel("build", "--config=ascend", f"--action_env=TOOL_LOG={log}", f"--action_env=FAKE_BUILD_SH={build_sh}",
                "//aclnn_custom_ops:custom_ops_build", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    text = log.read_text()
    assert "msopgen gen" in text and "build.sh env FAKE_CANN_ENV=bazel" in text
    # the rule's own script merged the presets with the shell's python3 (not only the repository rule's probe)
    assert any(line.startswith("python3-from-PATH - ") and "/project/CMakePresets.json" in line
               for line in text.splitlines()), text
    assert '"ASCEND_COMPUTE_UNIT": {"type": "STRING", "value": "ascend910b;ascend910_93"}' in text
    out = bazel("info", "--config=ascend", "bazel-bin", env=env).stdout.strip()
    for lib in ("libcust_opapi.so", "libcust_opsproto_rt2.0.so", "libcust_opmaster_rt2.0.so"):
        assert (Path(out) / "aclnn_custom_ops" / "lib" / lib).is_file()
