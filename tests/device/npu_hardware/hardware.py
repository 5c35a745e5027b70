"""Whether this process sees a real NPU: torch_npu (Huawei's, not tests/npu_emulator) imports and a device is
visible (rtp_llm's npu_status). Everywhere else the suite is skipped with the reason. RTP_NPU_SMOKE_ON_EMULATOR=1 lets
it run on the emulator (tests/device/npu/test_smoke_suite_on_emulator.py), so the suite reaches the hardware already
debugged."""

import os


def npu_reason() -> str:
    """Empty when a real NPU is usable, else why not."""
    from rtp_llm.device.npu import npu_status

    available, why = npu_status()
    if not available:
        return why + " (this suite runs on an Ascend machine: bazel test --config=ascend)"
    import torch_npu

    if getattr(torch_npu, "EMULATED", False) and not os.environ.get("RTP_NPU_SMOKE_ON_EMULATOR"):
        return "torch_npu here is tests/npu_emulator, not Huawei's"
    return ""


REASON = npu_reason()
