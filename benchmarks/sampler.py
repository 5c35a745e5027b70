"""One sampler step on the CPU: the CPU kernels (CpuOps: top_k_top_p.cc, exponential_race.cc) against the torch
reference every other device runs (TorchOps), on the same logits, in alternating rounds.

    python -m benchmarks.sampler [--rows 1 8 32] [--rounds 5]

The logits are the embedded default model's (SmolLM2, vocabulary 49152, run by transformers on a paragraph of
text), so top-p sees a language model's distribution, not noise. Cases: temperature 1 (the OpenAI default), the
Qwen3 recommendation (0.7, top_k 20, top_p 0.8), top_p 0.95 alone, and top_p 0.9 with a repetition penalty.
Both op sets must pick the same tokens (checked). Reports ms per step, min / median / max over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.device.torch_ops import TorchOps
from rtp_llm.sampling import Sampler, SamplingBatch, SamplingParams

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined a "
        "screw press, oil-based ink and movable metal type into a system that could produce books far faster than "
        "scribes. Within fifty years, presses were running in more than two hundred cities across Europe, and the "
        "price of a book fell so far that ordinary merchants could own a small library. Historians still argue "
        "about which consequences mattered most: the spread of literacy, the standardisation of languages, or the "
        "speed with which new scientific and religious ideas could travel.")

CASES = {
    "temperature1": dict(temperature=1.0),
    "qwen3_k20_p0.8": dict(temperature=0.7, top_k=20, top_p=0.8),
    "p0.95": dict(temperature=1.0, top_p=0.95),
    "p0.9_rep1.1": dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1),
}


def model_logits() -> torch.Tensor:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rtp_llm.models.default_model import default_model_path

    folder, name = os.path.split(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    ids = AutoTokenizer.from_pretrained(folder, gguf_file=name)(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits[0], ids[0].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5, help="calls timed per round (their median)")
    args = ap.parse_args()
    logits, ids = model_logits()
    samplers = {"torch": Sampler(TorchOps()), "cpu": Sampler(CpuOps())}
    for rows in args.rows:
        x = logits[torch.arange(rows) % logits.shape[0]].contiguous()
        for case, kw in CASES.items():
            params = [SamplingParams(seed=r, **kw) for r in range(rows)]
            batch = SamplingBatch.build(params, list(range(rows)), [len(ids) // 2] * rows, [ids] * rows,
                                        [ids[:len(ids) // 2]] * rows, x.shape[-1])
            tokens = {k: s(x, batch).token_ids for k, s in samplers.items()}
            assert torch.equal(tokens["torch"], tokens["cpu"]), case
            ms = {k: [] for k in samplers}
            for _ in range(args.rounds):
                for k, s in samplers.items():  # alternating: a co-tenant's burst hits both
                    times = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        s(x, batch)
                        times.append((time.perf_counter() - t0) * 1e3)
                    ms[k].append(statistics.median(times))
            row = {"rows": rows, "case": case}
            for k, v in ms.items():
                row[f"{k}_ms"] = [round(min(v), 2), round(statistics.median(v), 2), round(max(v), 2)]
            row["speedup_median"] = round(statistics.median(ms["torch"]) / statistics.median(ms["cpu"]), 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
