"""top-k/top-p: the C++ CPU twin vs the torch implementation, same inputs, same run.

    python -m benchmarks.top_k_top_p [--vocab 151936] [--batches 1 16 64]

Reports median milliseconds per call and the ratio torch / twin, for top-k=50 + top-p=0.9 (a common
chat setting) and top-p=0.95 alone (no top-k: the twin still avoids the full sort).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from rtp_llm._native import ops
from rtp_llm.sampling.top_k_top_p import apply_top_k_top_p


def _ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in args.batches:
        logits = torch.randn(batch, args.vocab, generator=gen) * 2
        for name, k, p in (("k50_p0.9", 50, 0.9), ("p0.95", None, 0.95)):
            kt = torch.full((batch,), k) if k else None
            pt = torch.full((batch,), p)
            assert torch.equal(ops().apply_top_k_top_p(logits, kt, pt), apply_top_k_top_p(logits, kt, pt))
            t_torch = _ms(lambda: apply_top_k_top_p(logits, kt, pt), args.repeats)
            t_twin = _ms(lambda: ops().apply_top_k_top_p(logits, kt, pt), args.repeats)
            row = {"batch": batch, "case": name, "torch_ms": round(t_torch, 2), "twin_ms": round(t_twin, 2),
                   "speedup": round(t_torch / t_twin, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
