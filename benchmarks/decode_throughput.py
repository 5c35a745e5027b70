"""Decode throughput of the static-batch path vs transformers, same weights, same run.

    python -m benchmarks.decode_throughput [--batches 1 32] [--prompt-len 128] [--new-tokens 64]

SmolLM2-135M-Instruct (the embedded GGUF, dequantized to fp32) on CPU, greedy, EOS ignored.
Decode tokens/s = batch * (new_tokens - 1) / (time(new_tokens) - time(1 token)), so the prefill is
taken out for both engines. Each measurement is the median of --repeats runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from rtp_llm.engine.model_runner import ModelRunner
from rtp_llm.engine.static_generate import generate_static
from rtp_llm.models.default_model import default_model_path
from rtp_llm.models.registry import load_model
from rtp_llm.sampling import SamplingParams


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()

    gguf = default_model_path()
    model, cfg = load_model(gguf, dtype="float32")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                              dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    gen = torch.Generator().manual_seed(0)
    results = {"model": "SmolLM2-135M-Instruct fp32", "threads": torch.get_num_threads(), "runs": []}
    for batch in args.batches:
        prompts = torch.randint(3, cfg.vocab_size, (batch, args.prompt_len), generator=gen)
        blocks = batch * ((args.prompt_len + args.new_tokens) // 16 + 2) + 1
        runner = ModelRunner(model, cfg, num_blocks=blocks, block_size=16, enable_prefix_cache=False)
        plist = prompts.tolist()

        def ours(n):
            return lambda: generate_static(runner, plist, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))

        def theirs(n):
            def run():
                with torch.no_grad():
                    hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=n,
                                min_new_tokens=n, do_sample=False, pad_token_id=0)
            return run

        row = {"batch": batch}
        for name, make in (("rtp_llm", ours), ("transformers", theirs)):
            make(2)()  # warm-up
            t1 = _median_time(make(1), args.repeats)
            tn = _median_time(make(args.new_tokens), args.repeats)
            row[f"{name}_decode_tok_s"] = batch * (args.new_tokens - 1) / (tn - t1)
            row[f"{name}_prefill_s"] = t1
        row["ratio"] = row["rtp_llm_decode_tok_s"] / row["transformers_decode_tok_s"]
        results["runs"].append(row)
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
