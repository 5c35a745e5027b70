"""N-gram prompt lookup (vLLM's "ngram"): the longest suffix of the context, of prompt_lookup_min to
prompt_lookup_max tokens, that also occurs earlier in it; the tokens that followed its latest earlier occurrence are
the drafts. Pays where the output repeats the input or itself (edits of a given file, quoting, reformatting)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rtp_llm.spec_decode.proposer import Proposer


def ngram_drafts(tokens: np.ndarray, lo: int, hi: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix (length lo..hi)
    of `tokens`; [] when none of at least lo tokens occurs earlier."""
    n = len(tokens)
    if k <= 0 or n < lo + 1:
        return []
    hi = min(hi, n - 1)
    # ends[e]: the candidate occurrence ends at e (< n - 1, so something follows it); run[e]: how many of the last
    # tokens it matches, counted backwards and capped at hi.
    ends = n - 1
    run = np.zeros(ends, dtype=np.int32)
    alive = np.ones(ends, dtype=bool)
    for j in range(hi):
        if j >= ends:
            break
        cand = tokens[:ends - j] == tokens[n - 1 - j]  # candidate ends e >= j: tokens[e - j] vs the suffix's
        alive[j:] &= cand
        alive[:j] = False
        run += alive
        if not alive.any():
            break
    best = int(run.max(initial=0))
    if best < lo:
        return []
    e = int(np.flatnonzero(run == best)[-1])
    return tokens[e + 1:e + 1 + k].tolist()


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.lo, self.hi = prompt_lookup_min, prompt_lookup_max

    def propose(self, seqs: Sequence, ks: Sequence[int], hidden=None) -> list[list[int]]:
        return [ngram_drafts(np.asarray(s.all_tokens(), dtype=np.int64), self.lo, self.hi, k)
                for s, k in zip(seqs, ks)]
