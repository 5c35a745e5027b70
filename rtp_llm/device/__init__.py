"""Devices: what differs between CPU, CUDA and Ascend NPU, in one place (one room per device).

A Device says which torch device tensors live on, how to query memory and synchronise, which collective backend
tensor parallelism uses, its KV-cache defaults, which attention backend and which op set its model graph runs.
Everything else in the engine is device-neutral.
"""

from __future__ import annotations

from typing import Optional

from rtp_llm.device.base import Device
from rtp_llm.device.cpu import CpuDevice
from rtp_llm.device.cuda import CudaDevice
from rtp_llm.device.npu import NpuDevice, npu_status
from rtp_llm.errors import DeviceError

_DEVICES = {"cpu": CpuDevice, "cuda": CudaDevice, "npu": NpuDevice}
DEVICE_CLASSES = _DEVICES  # by name, for what asks a device class itself (the doctor's self_check)


def resolve_device(name: str) -> str:
    """auto -> npu, then cuda, then cpu. An explicit device that is not there raises DeviceError whose message
    says why (torch_npu missing, CANN libraries not loading, no device visible)."""
    if name == "auto":
        for candidate in ("npu", "cuda"):
            if _DEVICES[candidate].available()[0]:
                return candidate
        return "cpu"
    if name not in _DEVICES:
        raise DeviceError(f"unknown device {name!r}; use auto, cpu, cuda or npu")
    ok, why = _DEVICES[name].available()
    if not ok:
        raise DeviceError(f"--device {name}: {why}")
    return name


def get_device(name: str, index: int = 0, options: Optional[dict] = None) -> Device:
    """The Device object for a device name (auto resolved); options: EngineConfig.device_options."""
    return _DEVICES[resolve_device(name)](index, options)


__all__ = ["CpuDevice", "CudaDevice", "Device", "DeviceError", "NpuDevice", "get_device", "npu_status",
           "resolve_device"]
