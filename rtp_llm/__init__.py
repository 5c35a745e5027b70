"""rtp-llm: an LLM inference and serving engine for CPU, CUDA and Ascend NPU.

    from rtp_llm import LLM, SamplingParams
"""

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
