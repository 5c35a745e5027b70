"""Whether this process sees a real NPU: torch_npu (Huawei's, not tests/npu_emulator) imports and a device is
visible. Everywhere else the suite is skipped with the reason. RTP_NPU_SMOKE_ON_EMULATOR=1 lets it run on the
emulator (tests/device/npu/test_smoke_suite_on_emulator.py), so the suite reaches the hardware already debugged."""

import importlib.util
import os


def npu_reason() -> str:
    """Empty when a real NPU is usable, else why not."""
    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed (this suite runs on an Ascend machine: bazel test --config=ascend)"
    try:
        import torch
        import torch_npu
    except (ImportError, OSError, RuntimeError) as exc:
        return f"torch_npu does not load ({type(exc).__name__}: {exc}); source CANN's set_env.sh"
    if getattr(torch_npu, "EMULATED", False) and not os.environ.get("RTP_NPU_SMOKE_ON_EMULATOR"):
        return "torch_npu here is tests/npu_emulator, not Huawei's"
    if not torch.npu.is_available() or torch.npu.device_count() == 0:
        return "torch_npu loads but sees no NPU (npu-smi info; ASCEND_RT_VISIBLE_DEVICES)"
    return ""


REASON = npu_reason()
