"""The CPU device: its op set, linear kernels, fused decoder layers and attention backend."""

from rtp_llm.device.cpu.device import CpuDevice

__all__ = ["CpuDevice"]
