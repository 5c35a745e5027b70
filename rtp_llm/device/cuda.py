"""CUDA GPUs through torch's own CUDA build: the plain-torch op set and the reference attention backend."""

import torch

from rtp_llm.device.base import Device


class CudaDevice(Device):
    name = "cuda"
    collective_backend = "nccl"

    @classmethod
    def available(cls):
        if not torch.cuda.is_available():
            return False, "torch sees no CUDA device (torch.cuda.is_available() is False)"
        return True, ""

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def bind_thread(self) -> None:
        torch.cuda.set_device(self.index)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)

    def memory_info(self):
        return torch.cuda.mem_get_info(self.index)

    def stream(self):
        return torch.cuda.current_stream(self.index)
