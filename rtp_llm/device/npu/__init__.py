"""The Ascend NPU device: torch_npu ops, the fused-infer-attention backend, the AscendC custom operator's loader."""

from rtp_llm.device.npu.device import NpuDevice, npu_status

__all__ = ["NpuDevice", "npu_status"]
