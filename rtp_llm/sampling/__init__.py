"""Sampling: parameters, the vectorised sampler, the penalties' token counts and structured outputs."""

from rtp_llm.sampling.params import SamplingParams
from rtp_llm.sampling.sampler import GreedyTokens, Sampler, SamplerOutput, SamplingBatch

__all__ = ["GreedyTokens", "Sampler", "SamplerOutput", "SamplingBatch", "SamplingParams"]
