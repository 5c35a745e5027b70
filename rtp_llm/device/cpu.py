"""CPU: the embedded default."""

import torch

from rtp_llm.device.base import Device


class CpuDevice(Device):
    name = "cpu"
    collective_backend = "gloo"
    default_attention = "cpu"  # C++ paged decode kernel + SDPA prefill; torch_ref stays the reference

    @classmethod
    def available(cls):
        return True, ""

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def ops(self):
        from rtp_llm.device.cpu_ops import CpuOps

        return CpuOps()
