"""Device selection. (The full Device interface, with the NPU, lives here as the Ascend work lands.)"""

from __future__ import annotations

import importlib.util


class DeviceError(RuntimeError):
    """The requested device is not available here; the message says why."""


def _npu_available() -> tuple[bool, str]:
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch
        import torch_npu  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:  # CANN libraries missing or mismatched
        return False, f"torch_npu does not load ({exc})"
    if not torch.npu.is_available():
        return False, "torch_npu loads but sees no NPU (check npu-smi and ASCEND_RT_VISIBLE_DEVICES)"
    return True, ""


def resolve_device(name: str) -> str:
    """auto -> npu, then cuda, then cpu. An explicit device that is not there raises DeviceError."""
    import torch

    if name == "cpu":
        return "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
        return "cuda"
    if name == "npu":
        ok, why = _npu_available()
        if not ok:
            raise DeviceError(f"--device npu: {why}")
        return "npu"
    if name == "auto":
        if _npu_available()[0]:
            return "npu"
        return "cuda" if torch.cuda.is_available() else "cpu"
    raise DeviceError(f"unknown device {name!r}; use auto, cpu, cuda or npu")
