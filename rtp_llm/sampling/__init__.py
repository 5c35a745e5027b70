"""Sampling: parameters, the vectorised sampler and the counter-based RNG."""

from rtp_llm.sampling.params import SamplingParams
from rtp_llm.sampling.sampler import GreedyTokens, Sampler, SamplerOutput, SamplingBatch

__all__ = ["GreedyTokens", "Sampler", "SamplerOutput", "SamplingBatch", "SamplingParams"]
