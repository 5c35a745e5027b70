"""The CPU's self-check (rtp_llm/doctor): the kernels' instruction set and one operator against its formula."""

from __future__ import annotations

import os

from rtp_llm.device.self_check import FAIL, WARN, Check, ok


def check_cpu() -> list[Check]:
    import torch

    out = []
    try:
        from rtp_llm import _native

        isa = _native.ops().cpu_isa()
        out.append(ok("cpu", f"{os.cpu_count()} cores, kernels for {isa}") if isa in ("avx512", "avx2") else
                   Check("cpu", WARN, f"{os.cpu_count()} cores, ISA {isa}", "an x86-64 CPU with AVX2 or AVX-512"))
    except (ImportError, OSError, RuntimeError, AttributeError):
        pass  # reported by check_python_stack
    x = torch.randn(4, 64)
    w = torch.randn(64)
    ref = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    from rtp_llm.device.cpu.ops import CpuOps

    got = CpuOps().rms_norm(x, w, 1e-6)
    out.append(ok("cpu operator", "rms_norm matches its formula") if torch.allclose(got, ref, atol=1e-5) else
               Check("cpu operator", FAIL, "rms_norm differs from its formula", "rebuild: bash scripts/setup.sh"))
    return out
