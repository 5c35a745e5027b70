"""rtp-llm: an LLM inference and serving engine for CPU, CUDA and Ascend NPU.

    from rtp_llm import LLM, SamplingParams
"""

import os as _os
import sys as _sys

# OpenMP worker threads spin for a while after every multi-threaded torch op, on the cores where rtp-llm's kernel
# threads (rtp_llm/cpp/cpu/work_pool.cc) run next, and take their time (measured: bf16 W 20-35% lower,
# benchmarks/ARCHIVE.md). libgomp reads this once, when torch loads: it applies when rtp_llm is imported first (the
# server, the CLI, engine and TP processes); otherwise the CPU device says so (rtp_llm/device/cpu/device.py).
OMP_PASSIVE_SET = "torch" not in _sys.modules and "OMP_WAIT_POLICY" not in _os.environ
if OMP_PASSIVE_SET:
    _os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name):  # lazy: `import rtp_llm` stays cheap (no torch) until the API is used
    if name == "LLM":
        from rtp_llm.llm import LLM

        return LLM
    if name == "SamplingParams":
        from rtp_llm.sampling.params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
