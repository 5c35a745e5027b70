"""TTFT of a request whose first 3 KV blocks are already cached, against the same request cold.

    python -m benchmarks.prefix_ttft [--blocks 3] [--suffix 8] [--repeats 9]

Offline engine on the embedded model (block size 16). Cold: a prompt never seen. Warm: a prompt whose
first 3 blocks (48 tokens) equal an earlier request's, plus an unseen suffix. TTFT = the request's arrival
(validated, queued) to its first token (RequestOutput.metrics). Medians of --repeats pairs, alternating.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from rtp_llm import LLM, SamplingParams


def _ttft(llm, prompt):
    out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True), use_tqdm=False)[0]
    return out.metrics["first_token"] - out.metrics["arrival"], out.num_cached_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--suffix", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    llm = LLM(max_model_len=1024, block_size=16)
    rng = random.Random(0)
    prefix_len = args.blocks * 16

    def tokens(n):
        return [rng.randrange(17, 49152) for _ in range(n)]

    _ttft(llm, tokens(prefix_len + args.suffix))  # warm-up
    cold, warm, cached = [], [], []
    for i in range(args.repeats):
        shared = tokens(prefix_len)
        t, _ = _ttft(llm, shared + tokens(args.suffix))        # computes everything
        cold.append(t)
        t, c = _ttft(llm, shared + tokens(args.suffix))        # reuses the 3 blocks
        warm.append(t)
        cached.append(c)
    result = {"prompt_tokens": prefix_len + args.suffix, "cached_tokens": statistics.median(cached),
              "cold_ttft_ms": round(statistics.median(cold) * 1e3, 2),
              "warm_ttft_ms": round(statistics.median(warm) * 1e3, 2)}
    result["warm_over_cold"] = round(result["warm_ttft_ms"] / result["cold_ttft_ms"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
