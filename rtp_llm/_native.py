"""Loads the C++ parts with errors that say how to build them:
rtp_llm._C (the KV-cache core, pybind11) and rtp_llm/_ops.so (CPU kernels as torch.ops.rtp_llm.*)."""

import os

_BUILD_HINT = ("run `bash scripts/setup.sh`, or `bazel build //rtp_llm:_C.so //rtp_llm:_ops.so && "
               "cp -f bazel-bin/rtp_llm/_C.so bazel-bin/rtp_llm/_ops.so rtp_llm/`")

try:
    from rtp_llm import _C  # noqa: F401  (re-exported)
except ImportError as exc:  # pragma: no cover - exercised only on an unbuilt checkout
    raise ImportError(f"rtp_llm/_C.so (the C++ runtime) is not built or does not load: {_BUILD_HINT} "
                      f"(cause: {exc})") from exc

_ops = None


def ops():
    """torch.ops.rtp_llm, with the CPU kernels of rtp_llm/_ops.so registered."""
    global _ops
    if _ops is None:
        import torch

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ops.so")
        if not os.path.exists(path):
            raise ImportError(f"rtp_llm/_ops.so (CPU kernels) is not built: {_BUILD_HINT}")
        torch.ops.load_library(path)
        _ops = torch.ops.rtp_llm
    return _ops


__all__ = ["_C", "ops"]
