"""Cost of the KV-cache bookkeeping of one scheduling step (no model work).

    python -m benchmarks.cache_bookkeeping [--steps 200] [--json out.json]

decode step:  256 running sequences of 32 blocks each: one batched append_decode (a slot per
              sequence) + filling the [256, max_blocks] int32 block table.
admission:    64 prompts of 512 tokens sharing a 2-block system prompt: can_allocate, add_sequence
              (prefix match) and slots for the uncached tokens, per prompt.
Baseline in the same run: the same decode step done per sequence from Python (one binding call per
sequence plus a Python row copy), which is what the batched calls replace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from rtp_llm.cache import KVCacheManager

BLOCK = 16
SEQS = 256
BLOCKS_PER_SEQ = 32


def _running_pool(steps: int) -> KVCacheManager:
    max_blocks = BLOCKS_PER_SEQ + steps // BLOCK + 2
    m = KVCacheManager(SEQS * max_blocks + 1, BLOCK)
    rng = np.random.default_rng(0)
    slots = np.empty(BLOCKS_PER_SEQ * BLOCK - 1, np.int32)
    for s in range(SEQS):
        m.add_sequence(s, rng.integers(0, 50000, BLOCKS_PER_SEQ * BLOCK - 1).astype(np.int32))
        m.append_slots(s, slots)
    return m


def bench_decode(steps: int) -> dict:
    m = _running_pool(steps)
    ids = np.arange(SEQS, dtype=np.int64)
    toks = np.ones(SEQS, np.int32)
    slots = np.empty(SEQS, np.int32)
    table = np.empty((SEQS, BLOCKS_PER_SEQ + steps // BLOCK + 2), np.int32)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        m.append_decode(ids, toks, slots)
        m.fill_block_tables(ids, table)
        times.append(time.perf_counter() - t0)

    m2 = _running_pool(steps)
    one_tok = np.ones(1, np.int32)
    one_slot = np.empty(1, np.int32)
    py_times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for s in range(SEQS):
            m2.extend_tokens(s, one_tok)
            m2.append_slots(s, one_slot)
            slots[s] = one_slot[0]
            row = m2.block_table(s)
            table[s, : len(row)] = row
            table[s, len(row):] = 0
        py_times.append(time.perf_counter() - t0)
    return {
        "decode_step_ms_median": statistics.median(times) * 1e3,
        "decode_step_ms_p99": sorted(times)[int(0.99 * (len(times) - 1))] * 1e3,
        "per_sequence_python_ms_median": statistics.median(py_times) * 1e3,
        "speedup_vs_per_sequence": statistics.median(py_times) / statistics.median(times),
    }


def bench_admission(rounds: int) -> dict:
    rng = np.random.default_rng(1)
    system = rng.integers(0, 50000, 2 * BLOCK).astype(np.int32)
    prompts = [np.concatenate([system, rng.integers(0, 50000, 512 - 2 * BLOCK).astype(np.int32)]) for _ in range(64)]
    times, hits = [], 0
    for _ in range(rounds):
        m = KVCacheManager(64 * 40 + 1, BLOCK)
        warm = np.empty(len(system) + 1, np.int32)
        m.add_sequence(10_000, np.concatenate([system, [7]]).astype(np.int32))
        m.append_slots(10_000, warm)
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            if not m.can_allocate(p, len(p)):
                raise RuntimeError("pool too small for the benchmark")
            cached = m.add_sequence(i, p)
            m.append_slots(i, np.empty(len(p) - cached, np.int32))
            hits += cached
        times.append(time.perf_counter() - t0)
    return {
        "admit_64_prompts_ms_median": statistics.median(times) * 1e3,
        "prefix_hit_tokens_per_prompt": hits / (rounds * 64),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    result = {"decode": bench_decode(args.steps), "admission": bench_admission(args.rounds)}
    result["whole_step_ms"] = result["decode"]["decode_step_ms_median"] + result["admission"]["admit_64_prompts_ms_median"]
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
