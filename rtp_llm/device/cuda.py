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

    @classmethod
    def self_check(cls) -> list:
        """The device and one matmul against the CPU."""
        from rtp_llm.device.self_check import FAIL, Check, ok

        if not torch.cuda.is_available():
            return [Check("cuda device", FAIL, f"torch {torch.__version__} sees no CUDA device",
                          "install a CUDA build of torch matching the driver (nvidia-smi)")]
        name = torch.cuda.get_device_name(0)
        x = torch.randn(64, 64)
        diff = float((x.cuda() @ x.cuda()).cpu().sub(x @ x).abs().max())
        out = [ok("cuda device", f"{torch.cuda.device_count()} visible, {name}")]
        out.append(ok("cuda operator", "matmul agrees with the CPU") if diff < 1e-2 else
                   Check("cuda operator", FAIL, f"matmul differs from the CPU by {diff:.3g}", "check the driver and torch"))
        return out

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
