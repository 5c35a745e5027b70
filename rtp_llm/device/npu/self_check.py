"""The NPU's self-check (rtp_llm/doctor): CANN's environment, npu-smi, torch_npu against the checked release, the
device initialising, one operator against the CPU, the custom-operator package."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from typing import Optional

from rtp_llm.device.self_check import FAIL, WARN, Check, ok


def _cann_home() -> Optional[str]:
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        if os.environ.get(var):
            return os.environ[var]
    return None


def check_cann_environment() -> Check:
    """CANN's set_env.sh exports ASCEND_HOME_PATH (and ASCEND_OPP_PATH); without it torch_npu finds no operators."""
    home = _cann_home()
    if home is None:
        return Check("CANN environment", FAIL, "ASCEND_HOME_PATH is not set: CANN's set_env.sh was not sourced",
                     "source /usr/local/Ascend/ascend-toolkit/set_env.sh (or $HOME/Ascend/ascend-toolkit/set_env.sh)")
    if not os.path.isdir(home):
        return Check("CANN environment", FAIL, f"ASCEND_HOME_PATH={home} is not a directory",
                     "reinstall the CANN toolkit, then source its set_env.sh")
    version = ""
    for name in ("version.cfg", "version.info"):
        p = os.path.join(home, name)
        if os.path.isfile(p):
            with open(p) as f:
                version = " ".join(f.read().split())[:120]
            break
    return ok("CANN environment", f"ASCEND_HOME_PATH={home}" + (f" ({version})" if version else ""))


def check_npu(npu_status) -> list[Check]:
    """npu_status: rtp_llm/device/npu/device.py's (whether torch_npu loads and sees a device, and why not)."""
    import rtp_llm.device.npu.versions as versions

    out = [check_cann_environment()]
    smi = shutil.which("npu-smi")
    if smi:
        res = subprocess.run([smi, "info"], capture_output=True, text=True, timeout=60)
        head = " ".join(res.stdout.split()[:12])
        out.append(ok("npu-smi", head) if res.returncode == 0 else
                   Check("npu-smi", FAIL, f"npu-smi info exited {res.returncode}: {res.stderr.strip()[:200]}",
                         "check the driver and firmware (npu-smi info; dmesg), and /dev/davinci* permissions"))
    else:
        out.append(Check("npu-smi", WARN, "npu-smi is not on PATH: driver and firmware versions unknown",
                         "install the Ascend driver (it ships npu-smi), or add /usr/local/sbin to PATH"))
    if importlib.util.find_spec("torch_npu") is None:
        out.append(Check("torch_npu", FAIL, "torch_npu is not installed",
                         f"pip install torch=={versions.TORCH} torch_npu=={versions.TORCH_NPU}"))
        return out
    available, why = npu_status()
    import torch_npu

    installed = getattr(torch_npu, "__version__", "?")
    emulated = getattr(torch_npu, "EMULATED", False)
    if emulated:
        out.append(Check("torch_npu", WARN, f"torch_npu is rtp-llm's CPU emulator (tests/npu_emulator), checked "
                                           f"against torch_npu {versions.TORCH_NPU}", "install Huawei's torch_npu"))
    elif installed.split("+")[0] != versions.TORCH_NPU:
        out.append(Check("torch_npu", WARN, f"torch_npu {installed}; rtp-llm's NPU path is checked against "
                                           f"{versions.TORCH_NPU}", f"pip install torch_npu=={versions.TORCH_NPU}"))
    else:
        out.append(ok("torch_npu", f"torch_npu {installed}"))
    if not available:
        out.append(Check("npu device", FAIL, why, "npu-smi info; ASCEND_RT_VISIBLE_DEVICES; source set_env.sh"))
        return out
    import torch

    try:
        torch.npu.set_device(0)
        out.append(ok("npu device", f"{torch.npu.device_count()} visible, npu:0 initialised"))
    except RuntimeError as exc:
        out.append(Check("npu device", FAIL, f"torch.npu.set_device(0) failed: {exc}",
                         "check the driver (npu-smi info) and that no other process holds the card"))
        return out
    out.append(_npu_operator_smoke(torch, torch_npu))
    out.append(_custom_operator_package())
    return out


def _npu_operator_smoke(torch, torch_npu) -> Check:
    """npu_rms_norm on the device against the CPU formula (bf16 inputs, float32 reference, one bf16 rounding)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 128, generator=g).bfloat16(), (1 + 0.1 * torch.randn(128, generator=g)).bfloat16()
    try:
        y = torch_npu.npu_rms_norm(x.to("npu:0"), w.to("npu:0"), 1e-6)[0].cpu().float()
    except RuntimeError as exc:
        msg = exc.args[0] if exc.args else str(exc)
        return Check("npu operator", FAIL, f"npu_rms_norm failed: {msg[:300]}",
                     "the operator packages of CANN (kernels) are missing or do not match the toolkit")
    xf = x.float()
    ref = xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + 1e-6) * w.float()
    if not torch.allclose(y, ref, rtol=2 ** -7, atol=1e-2):
        return Check("npu operator", FAIL, f"npu_rms_norm differs from the CPU by {float((y - ref).abs().max()):.3g}",
                     "CANN's kernels and toolkit versions disagree: reinstall the matching kernels package")
    return ok("npu operator", "npu_rms_norm agrees with the CPU")


def _custom_operator_package() -> Check:
    path = os.environ.get("ASCEND_CUSTOM_OPP_PATH")
    if not path:
        return Check("custom operators", WARN, "ASCEND_CUSTOM_OPP_PATH is not set: top-k/top-p runs on "
                     "torch_npu.npu_top_k_top_p", "optional: build and install aclnn_custom_ops (docs/ascend.md)")
    libs = [os.path.join(e, "op_api", "lib", "libcust_opapi.so") for e in path.split(":") if e]
    found = [lib for lib in libs if os.path.isfile(lib)]
    if not found:
        return Check("custom operators", FAIL, f"no entry of ASCEND_CUSTOM_OPP_PATH={path} has op_api/lib/"
                     "libcust_opapi.so", "point it at the unpacked vendors/<vendor> folder of opp.tar")
    from rtp_llm.device.npu.ops import load_custom_top_k_top_p

    if load_custom_top_k_top_p() is None:
        return Check("custom operators", WARN, f"{found[0]} is there but rtp-llm's operator does not load from it "
                     "(see the log line above)", "bazel build --config=ascend //rtp_llm:_npu_ops.so, copy it to rtp_llm/")
    return ok("custom operators", f"aclnnApplyTopKTopPCustom from {found[0]}")
