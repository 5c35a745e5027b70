"""The self-check before serving on a new machine: the machine's checks here (the Python stack, /dev/shm), each
device's own in its room (Device.self_check: rtp_llm/device/*/self_check.py), then the preflight of a model and its
serving flags on that device (rtp_llm/doctor/preflight.py)."""

from __future__ import annotations

import platform
import shutil

from rtp_llm.device.self_check import FAIL, PASS, WARN, Check, ok

GiB = 1 << 30
SHM_MIN = 1 * GiB  # torch's shared-memory tensors and CANN's HCCL buffers: a container's 64 MB default dies with a Bus error


def check_python_stack() -> list[Check]:
    """torch and the compiled extensions this checkout needs."""
    import torch

    from rtp_llm.device.npu import versions

    out = [ok("torch", f"torch {torch.__version__} (Python {platform.python_version()})")]
    if torch.__version__.split("+")[0] != versions.TORCH:
        out[0] = Check("torch", WARN, f"torch {torch.__version__}; this release pins torch {versions.TORCH}",
                       f"pip install torch=={versions.TORCH} (requirements.txt)")
    try:
        from rtp_llm import _native

        _native.ops()
        out.append(ok("rtp-llm kernels", "rtp_llm/_C.so and rtp_llm/_ops.so load"))
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        out.append(Check("rtp-llm kernels", FAIL, f"the compiled extensions do not load: {exc}",
                         "bash scripts/setup.sh (builds rtp_llm/_C.so and rtp_llm/_ops.so with Bazel)"))
    return out


def check_shm(path: str = "/dev/shm", minimum: int = SHM_MIN) -> Check:
    """/dev/shm's size: a container's default (64 MB) kills processes that share tensors with a Bus error."""
    try:
        total = shutil.disk_usage(path).total
    except OSError as exc:
        return Check("/dev/shm", FAIL, f"{path} is not there ({exc})", "mount a tmpfs at /dev/shm (docker: --shm-size 8g)")
    if total < minimum:
        return Check("/dev/shm", FAIL, f"{path} holds {total / GiB:.2f} GiB, below {minimum / GiB:.0f} GiB",
                     "docker run --shm-size 8g ... (or mount -o remount,size=8G /dev/shm)")
    return ok("/dev/shm", f"{total / GiB:.1f} GiB")


def device_checks(device: str) -> list[Check]:
    """The checks of one device (cpu, cuda, npu): the Python stack and /dev/shm, then the device's own."""
    from rtp_llm.device import DEVICE_CLASSES

    return check_python_stack() + [check_shm()] + DEVICE_CLASSES[device].self_check()


__all__ = ["Check", "PASS", "WARN", "FAIL", "ok", "device_checks", "check_shm", "check_python_stack", "GiB", "SHM_MIN"]
