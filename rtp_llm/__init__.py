"""rtp-llm: an LLM inference and serving engine for CPU, CUDA and Ascend NPU."""

__version__ = "0.1.0"
