"""The NPU bridge (rtp_llm/cpp/ascend) against the real torch_npu 2.13.0 headers and library, unpacked
from the pinned wheel by scripts/setup.sh into .deps/ (no CANN here: compile and link only).

- apply_top_k_top_p_custom.cc compiles against torch_npu's own headers (NPUStream.h, OpCommand.h, acl/acl.h);
- it links into a shared object with every symbol it needs defined by libtorch / libtorch_npu: nothing from
  libnnopbase / libopapi (aclCreateTensor, aclDestroyTensor, aclCreateIntArray, aclnn*), which torch_npu does
  not link, so loading rtp_llm/_npu_ops.so cannot fail on an undefined symbol;
- the launch goes through torch_npu's task queue (OpCommand::RunOpApiV2), so it orders after queued ops.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIN = (ROOT / "requirements-torch-npu.txt").read_text().split("torch-npu==")[1].split()[0]
TORCH_NPU = ROOT / ".deps" / f"torch_npu-{PIN}" / "torch_npu"
BRIDGE = ROOT / "rtp_llm" / "cpp" / "ascend" / "apply_top_k_top_p_custom.cc"

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None, reason="g++ / nm missing"),
    pytest.mark.skipif(not (TORCH_NPU / "lib" / "libtorch_npu.so").exists(),
                       reason=f"{TORCH_NPU} missing: run scripts/setup.sh"),
]


def _compile_flags():
    import torch
    import torch.utils.cpp_extension as ext

    inc = TORCH_NPU / "include"
    return [f"-I{ROOT}", f"-I{inc}", f"-I{inc / 'third_party' / 'acl' / 'inc'}",
            *[f"-isystem{p}" for p in ext.include_paths()],
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    """(object file, shared object, link result) of the bridge built the way //rtp_llm:_npu_ops.so is."""
    import torch.utils.cpp_extension as ext

    out = tmp_path_factory.mktemp("npu_bridge")
    obj, so = out / "bridge.o", out / "_npu_ops.so"
    cc = subprocess.run(["g++", "-std=c++17", "-fPIC", "-O0", "-Wall", "-c", *_compile_flags(), str(BRIDGE),
                         "-o", str(obj)], capture_output=True, text=True, timeout=600)
    assert cc.returncode == 0, cc.stderr[-4000:]
    torch_lib = Path(ext.include_paths()[0]).parent / "lib"
    # --no-undefined: every symbol of the bridge must come from the libraries named here;
    # --allow-shlib-undefined: libtorch_npu's own CANN dependencies are not on this machine.
    link = subprocess.run(["g++", "-shared", "-o", str(so), str(obj), f"-L{torch_lib}", f"-L{TORCH_NPU / 'lib'}",
                           "-ltorch_npu", "-ltorch", "-ltorch_cpu", "-lc10", "-ldl",
                           "-Wl,--no-undefined", "-Wl,--allow-shlib-undefined"],
                          capture_output=True, text=True, timeout=600)
    return obj, so, link


def _undefined(obj):
    res = subprocess.run(["nm", "-uC", str(obj)], capture_output=True, text=True, check=True)
    return {line.split(None, 1)[-1] for line in res.stdout.splitlines() if line.strip()}


def test_bridge_links_with_torch_npu_alone(bridge):
    _, so, link = bridge
    assert link.returncode == 0, "undefined symbols (not in libtorch / libtorch_npu):\n" + link.stderr[-4000:]
    assert so.exists()


def test_no_cann_operator_symbol_is_linked(bridge):
    obj, _, _ = bridge
    # plain C names from libnnopbase / libopapi must be dlsym'd, never referenced
    cann = sorted(s for s in _undefined(obj) if re.match(r"^acl(nn|Create|Destroy)", s))
    assert not cann, f"referenced directly (resolve them by dlsym): {cann}"


def test_launch_goes_through_the_task_queue(bridge):
    obj, _, _ = bridge
    undefined = _undefined(obj)
    assert any(s.startswith("at_npu::native::OpCommand::RunOpApiV2(") for s in undefined), \
        "EXEC_NPU_CMD must submit through OpCommand::RunOpApiV2 (torch_npu's task queue)"
    assert any(s.startswith("c10_npu::getCurrentNPUStream(") for s in undefined)
