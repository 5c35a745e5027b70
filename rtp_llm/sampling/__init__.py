"""Sampling: parameters, the vectorised sampler and the documented top-k/top-p algorithm."""

from rtp_llm.sampling.params import SamplingParams
from rtp_llm.sampling.sampler import GreedyTokens, Sampler, SamplerOutput, SamplingBatch
from rtp_llm.sampling.top_k_top_p import apply_top_k_top_p

__all__ = ["GreedyTokens", "Sampler", "SamplerOutput", "SamplingBatch", "SamplingParams", "apply_top_k_top_p"]
