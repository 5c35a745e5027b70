"""Speculative decoding: proposers draft tokens, the engine verifies them in its normal mixed batch.

The floor between the engine and the rest: it reads sequences (their tokens, params and grammar) without importing
the engine.
"""

from rtp_llm.spec_decode.ngram import NgramProposer
from rtp_llm.spec_decode.proposer import Proposer
from rtp_llm.spec_decode.speculator import Speculator

__all__ = ["NgramProposer", "Proposer", "Speculator", "make_proposer"]


def make_proposer(config, **kwargs) -> Proposer:
    """The proposer a SpeculativeConfig names (kwargs: the target engine and max_batch, for a draft model)."""
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "lookup":
        from rtp_llm.spec_decode.lookup import LookupProposer

        return LookupProposer(config.prompt_lookup_max)
    if config.method == "draft_model":
        from rtp_llm.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(config, **kwargs)
    raise ValueError(f"unknown speculative method {config.method!r}")
