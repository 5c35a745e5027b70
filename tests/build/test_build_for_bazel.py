"""aclnn_custom_ops/build_for_bazel.sh against fake CANN trees with stand-in msopgen, bisheng and cmake:
the discovery order, the op-package flow (msopgen's project, our sources over its stubs, the presets
merged, host code as C++17, CANN's build.sh, the .run installer), the error messages when pieces are
missing, and where the outputs land. Also shellcheck-clean."""

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "aclnn_custom_ops"
SCRIPT = PKG / "build_for_bazel.sh"
OP = "apply_top_k_top_p_custom"
SOCS = "ascend910b;ascend910_93"  # Atlas A2 and A3, as aclnn_custom_ops/BUILD passes them

# A stand-in msopgen: lays out the op-package project the way `msopgen gen ... -lan cpp` does (template
# presets, a cmake/intf.cmake compiling host code as C++11, generated stubs in op_host / op_kernel), and a
# build.sh that records what CANN's build would see and packs a .run installer.
FAKE_MSOPGEN = r"""#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
open(os.environ["TOOL_LOG"], "a").write("msopgen " + " ".join(args) + "\n")
out = args[args.index("-out") + 1]
ops = json.load(open(args[args.index("-i") + 1]))
def snake(name):
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))
for d in ("cmake/util", "op_host", "op_kernel", "scripts"):
    os.makedirs(os.path.join(out, d), exist_ok=True)
open(os.path.join(out, "cmake/intf.cmake"), "w").write("target_compile_options(intf_pub INTERFACE -std=c++11)\n")
if os.environ.get("CXX11_ELSEWHERE"):
    open(os.path.join(out, "cmake/util/flags.txt"), "w").write("-std=c++11\n")
presets = {"version": 1, "configurePresets": [{"name": "default", "binaryDir": "${sourceDir}/build_out",
           "cacheVariables": {"ASCEND_CANN_PACKAGE_PATH": {"type": "PATH", "value": "/usr/local/Ascend/latest"},
                              "ENABLE_SOURCE_PACKAGE": {"type": "BOOL", "value": "True"},
                              "vendor_name": {"type": "STRING", "value": "customize"}}}]}
json.dump(presets, open(os.path.join(out, "CMakePresets.json"), "w"))
for op in ops:
    s = snake(op["op"])
    for rel in ("op_host/%s.cpp" % s, "op_host/%s_tiling.h" % s, "op_kernel/%s.cpp" % s):
        open(os.path.join(out, rel), "w").write("GENERATED STUB\n")
open(os.path.join(out, "build.sh"), "w").write(open(os.environ["FAKE_BUILD_SH"]).read())
"""

FAKE_BUILD_SH = r"""#!/usr/bin/env bash
set -e
log=$TOOL_LOG
echo "build.sh env FAKE_CANN_ENV=${FAKE_CANN_ENV:-unset}" >> "$log"
grep -rl "GENERATED STUB" op_host op_kernel | sed 's/^/build.sh stub left: /' >> "$log" || true
grep -h -o -- '-std=c++[0-9]*' cmake/intf.cmake | sed 's/^/build.sh host std: /' >> "$log"
vendor=$(python3 -c "import json; p = json.load(open('CMakePresets.json'))['configurePresets'][0]; print(p['cacheVariables']['vendor_name']['value'])")
python3 -c "import json; print('build.sh presets', json.dumps(json.load(open('CMakePresets.json'))['configurePresets'][0]['cacheVariables'], sort_keys=True))" >> "$log"
[ -n "${SKIP_RUN:-}" ] && exit 0
mkdir -p build_out
cat > build_out/custom_opp_linux_x86_64.run <<EOF
#!/usr/bin/env bash
for a in "\$@"; do case \$a in --install-path=*) dest=\${a#--install-path=};; esac; done
echo "installer \$*" >> "$log"
v=\$dest/vendors/$vendor
mkdir -p "\$v/op_api/lib" "\$v/op_proto/lib/linux/x86_64" "\$v/op_impl/ai_core/tbe/op_tiling/lib/linux/x86_64"
[ -n "\${SKIP_OPAPI:-}" ] || echo opapi > "\$v/op_api/lib/libcust_opapi.so"
echo proto > "\$v/op_proto/lib/linux/x86_64/libcust_opsproto_rt2.0.so"
echo master > "\$v/op_impl/ai_core/tbe/op_tiling/lib/linux/x86_64/libcust_opmaster_rt2.0.so"
EOF
"""


def fake_cann(root: Path, bisheng=True, env_file=True, msopgen=True, marker="toolkit") -> Path:
    (root / "compiler" / "ccec_compiler" / "bin").mkdir(parents=True)
    if env_file:
        (root / "set_env.sh").write_text(f"export FAKE_CANN_ENV={marker}\n")
    if bisheng:
        b = root / "compiler" / "ccec_compiler" / "bin" / "bisheng"
        b.write_text("#!/bin/sh\nexit 0\n")
        b.chmod(0o755)
    if msopgen:
        m = root / "python" / "site-packages" / "bin" / "msopgen"
        m.parent.mkdir(parents=True)
        m.write_text(FAKE_MSOPGEN.replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1))
        m.chmod(0o755)
    (root / "opp").mkdir()
    return root


def run(tmp_path, env_over, ops=OP, with_cmake=True):
    # PATH holds only the utilities the script uses (so no system cmake / msopgen can stand in) + the fakes.
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for util in ("dirname", "find", "tar", "cp", "rm", "mkdir", "grep", "sed", "cat", "env", "sh", "bash", "chmod"):
        if not (tools / util).exists():
            (tools / util).symlink_to(shutil.which(util))
    if not (tools / "python3").exists():
        (tools / "python3").symlink_to(sys.executable)
    if with_cmake and not (tools / "cmake").exists():
        (tools / "cmake").write_text("#!/bin/sh\nexit 0\n")
        (tools / "cmake").chmod(0o755)
    build_sh = tmp_path / "fake_build.sh"
    build_sh.write_text(FAKE_BUILD_SH)
    log = tmp_path / "tool.log"
    env = {"PATH": str(tools), "TOOL_LOG": str(log), "FAKE_BUILD_SH": str(build_sh), "HOME": str(tmp_path)}
    env.update(env_over)
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(SCRIPT), str(out), ops, SOCS], env=env, capture_output=True, text=True,
                         timeout=120)
    text = log.read_text() if log.exists() else ""
    if log.exists():
        log.unlink()
    return res, out, text


def test_op_package_flow_builds_and_collects_outputs(tmp_path):
    cann = fake_cann(tmp_path / "home")
    res, out, log = run(tmp_path, {"ASCEND_HOME_PATH": str(cann)})
    assert res.returncode == 0, res.stderr
    for lib in ("libcust_opapi.so", "libcust_opsproto_rt2.0.so", "libcust_opmaster_rt2.0.so"):
        assert (out / "lib" / lib).is_file()
    with tarfile.open(out / "opp.tar") as tar:
        assert "customize/op_api/lib/libcust_opapi.so" in tar.getnames()
    # msopgen generated the project (for the first SOC: its layout is the same for both) from the op's description
    gen = next(line for line in log.splitlines() if line.startswith("msopgen "))
    assert "-c ai_core-ascend910b" in gen and "-lan cpp" in gen
    assert json.loads((out / "ops.json").read_text()) == json.loads((PKG / OP / f"{OP}.json").read_text())
    # our sources replaced its stubs, byte for byte
    assert "stub left" not in log
    for part in ("op_host", "op_kernel"):
        for src in (PKG / OP / part).iterdir():
            assert (out / "project" / part / src.name).read_bytes() == src.read_bytes()
    # host code compiled as C++17, presets merged, CANN's environment sourced before its build
    assert "build.sh host std: -std=c++17" in log and "-std=c++11" not in log
    presets = json.loads(next(line for line in log.splitlines() if line.startswith("build.sh presets "))[17:])
    assert presets["ASCEND_CANN_PACKAGE_PATH"]["value"] == str(cann)
    assert presets["ASCEND_COMPUTE_UNIT"]["value"] == "ascend910b;ascend910_93"  # kernels for A2 and A3
    assert presets["ENABLE_SOURCE_PACKAGE"]["value"] == "False"
    assert presets["vendor_name"]["value"] == "customize"
    assert "build.sh env FAKE_CANN_ENV=toolkit" in log
    assert f"--install-path={out / 'install'}" in log  # the .run installed the package here


def test_vendor_name_reaches_the_package(tmp_path):
    cann = fake_cann(tmp_path / "home")
    res, out, _ = run(tmp_path, {"ASCEND_HOME_PATH": str(cann), "ASCEND_VENDOR_NAME": "rtp_llm"})
    assert res.returncode == 0, res.stderr
    with tarfile.open(out / "opp.tar") as tar:
        assert "rtp_llm/op_api/lib/libcust_opapi.so" in tar.getnames()


def test_discovery_order(tmp_path):
    home = fake_cann(tmp_path / "home", marker="home")
    opp_toolkit = fake_cann(tmp_path / "tk", marker="opp")
    # ASCEND_HOME_PATH wins over ASCEND_OPP_PATH
    res, _, log = run(tmp_path, {"ASCEND_HOME_PATH": str(home), "ASCEND_OPP_PATH": str(opp_toolkit / "opp")})
    assert res.returncode == 0 and f"CANN at {home}" in res.stdout and "FAKE_CANN_ENV=home" in log
    # without it, ASCEND_OPP_PATH's toolkit
    res, _, log = run(tmp_path, {"ASCEND_OPP_PATH": str(opp_toolkit / "opp")})
    assert res.returncode == 0 and f"CANN at {opp_toolkit}" in res.stdout and "FAKE_CANN_ENV=opp" in log


def test_toolkit_path_and_a_users_home_install_are_found(tmp_path):
    tk = fake_cann(tmp_path / "tk", marker="tk")
    res, _, log = run(tmp_path, {"ASCEND_TOOLKIT_PATH": str(tk)})
    assert res.returncode == 0 and f"CANN at {tk}" in res.stdout and "FAKE_CANN_ENV=tk" in log
    # a non-root install (CANN's installer without root puts it under $HOME/Ascend); run() sets HOME = tmp_path
    user = fake_cann(tmp_path / "Ascend" / "ascend-toolkit" / "latest", marker="user")
    res, _, log = run(tmp_path, {})
    assert res.returncode == 0 and f"CANN at {user}" in res.stdout and "FAKE_CANN_ENV=user" in log


def test_missing_cann_names_what_was_tried(tmp_path):
    res, _, _ = run(tmp_path, {"ASCEND_HOME_PATH": str(tmp_path / "nope"), "ASCEND_OPP_PATH": str(tmp_path / "x/opp")})
    assert res.returncode != 0
    assert "CANN not found" in res.stderr and "ASCEND_HOME_PATH=" in res.stderr and "ASCEND_OPP_PATH=" in res.stderr
    assert "/usr/local/Ascend/ascend-toolkit/latest" in res.stderr and f"{tmp_path}/Ascend/ascend-toolkit/latest" in res.stderr


@pytest.mark.parametrize("case,needle", [
    ("no_env", "no set_env.sh"),
    ("no_msopgen", "msopgen"),
    ("no_bisheng", "bisheng"),
    ("no_cmake", "cmake not found"),
    ("bad_op", "operator 'no_such_op'"),
    ("cxx11_elsewhere", "C++11"),
    ("no_run", "no custom_opp_*.run"),
    ("no_output", "no libcust_opapi.so"),
])
def test_missing_pieces(tmp_path, case, needle):
    cann = fake_cann(tmp_path / "home", bisheng=case != "no_bisheng", env_file=case != "no_env",
                     msopgen=case != "no_msopgen")
    env = {"ASCEND_HOME_PATH": str(cann)}
    env.update({"no_output": {"SKIP_OPAPI": "1"}, "no_run": {"SKIP_RUN": "1"},
                "cxx11_elsewhere": {"CXX11_ELSEWHERE": "1"}}.get(case, {}))
    res, _, _ = run(tmp_path, env, ops="no_such_op" if case == "bad_op" else OP, with_cmake=case != "no_cmake")
    assert res.returncode != 0 and needle in res.stderr, res.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean():
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
