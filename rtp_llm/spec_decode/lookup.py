"""Lookup decoding (method "lookup", an rtp-llm extension; the idea of llama.cpp's llama-lookup): n-gram statistics
of the sequence's own context. When its last prompt_lookup_max tokens occurred before, the drafts are what followed
their latest occurrence, as "ngram" drafts (what pays on verbatim copies). Otherwise each draft token is the most
frequent continuation of the longest suffix (prompt_lookup_max tokens down to one) that was seen, taken only when it
was seen often and confidently enough (llama.cpp's lax thresholds), and looked up again after every drafted token:
what pays on reformatting, where the structure repeats but no long run does. Counts are kept per sequence and
extended with its new tokens at each step."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rtp_llm.spec_decode.ngram import ngram_drafts
from rtp_llm.spec_decode.proposer import Proposer

# Per n-gram length 1, 2, 3, 4+: the fewest times it must have been seen, and the share of those its most frequent
# continuation must have (llama.cpp's draft_min_sample_size_lax / draft_min_percent_lax).
MIN_SEEN = (2, 2, 1, 1)
MIN_PERCENT = (66, 50, 50, 50)


class NgramCounts:
    """For every n-gram (n = 1..hi) of a token sequence: how often each token followed it, and where last."""

    def __init__(self, hi: int):
        self.hi = hi
        self.tokens: list[int] = []
        self.next: dict[tuple, dict[int, list[int]]] = {}  # n-gram -> {token: [count, last position]}

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens) - 1  # t follows the n-grams ending just before it
            for n in range(1, min(self.hi, end) + 1):
                seen = self.next.setdefault(tuple(self.tokens[end - n:end]), {}).setdefault(t, [0, 0])
                seen[0] += 1
                seen[1] = end

    def draft(self, k: int) -> list[int]:
        tail, out = self.tokens[-self.hi:], []
        for _ in range(k):
            pick = None
            for n in range(min(self.hi, len(tail)), 0, -1):
                after = self.next.get(tuple(tail[-n:]))
                if after is None:
                    continue
                total = sum(c for c, _ in after.values())
                token, (count, _) = max(after.items(), key=lambda kv: (kv[1][0], kv[1][1]))
                level = min(n, len(MIN_SEEN)) - 1
                if total >= MIN_SEEN[level] and count * 100 >= MIN_PERCENT[level] * total:
                    pick = token
                break  # the longest suffix seen decides, confident or not
            if pick is None:
                break
            out.append(pick)
            tail = (tail + [pick])[-self.hi:]
        return out


class LookupProposer(Proposer):
    name = "lookup"

    def __init__(self, prompt_lookup_max: int):
        self.hi = prompt_lookup_max
        self.counts: dict[int, NgramCounts] = {}  # sequence id -> its context's counts

    def propose(self, seqs: Sequence, ks: Sequence[int], hidden=None) -> list[list[int]]:
        out = []
        for s, k in zip(seqs, ks):
            tokens = s.all_tokens()
            counts = self.counts.get(s.seq_id)
            if counts is None or len(counts.tokens) > len(tokens):
                counts = self.counts[s.seq_id] = NgramCounts(self.hi)
            counts.extend(tokens[len(counts.tokens):])
            if k <= 0:
                out.append([])
                continue
            run = ngram_drafts(np.asarray(tokens, dtype=np.int64), self.hi, self.hi, k)
            out.append(run if run else counts.draft(k))
        return out

    def release(self, seq) -> None:
        self.counts.pop(seq.seq_id, None)
