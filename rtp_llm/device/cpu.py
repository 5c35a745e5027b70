"""CPU: the embedded default."""

import os

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

    def share_host(self, local_ranks: int) -> None:
        # Ranks on one machine share its cores; oversubscribed OpenMP pools would fight over them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))

    def ops(self, config=None):
        from rtp_llm.device.cpu_ops import CpuOps

        return CpuOps(gemv_weights=config.cpu_gemv_weights if config is not None else "auto")
