"""Makes `import torch_npu` load the emulator (tests/npu_emulator/torch_npu)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def install():
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    mod = sys.modules.get("torch_npu")
    if mod is not None and not getattr(mod, "EMULATED", False):
        raise RuntimeError("a real torch_npu is already imported; the emulator cannot replace it")
    import torch_npu

    assert torch_npu.EMULATED
    return torch_npu


def env_for_subprocess(env: dict) -> dict:
    """An environment whose Python processes import the emulator as torch_npu."""
    env = dict(env)
    env["PYTHONPATH"] = HERE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
