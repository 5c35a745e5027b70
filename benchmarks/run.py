"""Benchmark harness: engines side by side on the same workload, in alternating rounds.

    python -m benchmarks.run --workload W --engines rtp_llm,vllm,transformers --rounds 3 [--json out.json]
    python -m benchmarks.run --workload W --engines rtp_llm@.,rtp_llm@../baseline --rounds 3   # a change vs before
    python -m benchmarks.run --workload W --engines rtp_llm,vllm --rounds 5 --hog 2,3   # beside a co-tenant

Peers with their own environments are created once by a script: vllm by bash benchmarks/peers/setup_vllm.sh
(~4 minutes), llamacpp by bash benchmarks/peers/setup_llamacpp.sh (~15 minutes, builds llama.cpp from source).

Every engine must produce the same first 8 greedy tokens on the same prompts in float32 (checked), so the
comparison is of equal work; in bfloat16 each engine's first token must be one of the float32 transformers
near-ties (engines round bf16 differently and the random-token prompts have near-flat logits).
Reported per engine: output tokens/s (median, min, max over rounds), time per output token after the
first (TPOT, the decode rate: (total - TTFT) / (tokens - 1)), and same-round ratios against the first peer; then
the workload's FLOPs over each engine's median time as a share of torch's best F.linear rate in the run's dtype,
measured after the rounds (benchmarks/gemm_rate.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch

from benchmarks.engines import VLLM, LlamaCpp, RtpLLM, RtpLLMCheckout, RtpLLMDequantized, RtpLLMTP2, Transformers
from benchmarks.workloads import WORKLOADS

ENGINES = {"rtp_llm": RtpLLM, "rtp_llm_dequantized": RtpLLMDequantized, "rtp_llm_tp2": RtpLLMTP2,
           "transformers": Transformers, "hf": Transformers, "vllm": VLLM, "llamacpp": LlamaCpp}
# float32 runs: the leading greedy tokens that must agree between engines. bfloat16 runs: each engine's first
# token must be one of the float32 reference's near-ties (bf16 kernels round differently from engine to
# engine, and near-ties on random-token prompts flip).
CHECK_TOKENS = {"float32": 8, "bfloat16": 1}
BF16_TIE_MARGIN = 0.25
IDLE_PAUSE_S = 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="W", choices=sorted(WORKLOADS))
    ap.add_argument("--engines", default="rtp_llm,transformers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json")
    ap.add_argument("--png", help="also draw throughput and time per output token per engine")
    ap.add_argument("--hog", help="ON,OFF: a co-tenant on the last core, busy ON seconds then idle OFF, during the "
                                  "measured rounds (benchmarks/hog.py)")
    args = ap.parse_args()

    wl = WORKLOADS[args.workload]
    prompts = wl.prompts()
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    engines = {n: _engine(n, args.dtype) for n in names}
    for e in engines.values():  # warm-up at full batch (allocator, thread pools, KV pages), not measured
        e.run(prompts, 2)
    results = {n: [] for n in names}
    first_tokens = {}
    hog = None
    if args.hog:
        from benchmarks.hog import parse

        hog = parse(args.hog)
    with hog if hog is not None else contextlib.nullcontext():
        _rounds(args, names, engines, prompts, wl, results, first_tokens)
    for e in engines.values():
        if hasattr(e, "close"):
            e.close()
    ref = names[0]
    if args.dtype == "float32":
        agree = {n: sum(a == b for a, b in zip(first_tokens[ref], first_tokens[n])) / len(prompts) for n in names}
    else:
        ties = _fp32_near_ties(prompts, BF16_TIE_MARGIN)
        agree = {n: sum(t[0] in tie for t, tie in zip(first_tokens[n], ties)) / len(prompts) for n in names}
    summary = {"workload": wl.__dict__, "dtype": args.dtype, "threads": torch.get_num_threads(),
               "co_tenant": hog.describe() if hog is not None else None,
               "first_tokens_agree": agree, "engines": {}}
    for n in names:
        vals = [x["tok_s"] for x in results[n]]
        summary["engines"][n] = {"tok_s_median": statistics.median(vals), "tok_s_min": min(vals),
                                 "tok_s_max": max(vals),
                                 "tpot_ms_median": statistics.median(x["tpot_ms"] for x in results[n]),
                                 "rounds": results[n]}
    _gemm_share(summary, wl, args.dtype)
    for n in names[1:]:
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(results[ref], results[n])]
        summary["engines"][n][f"{ref}_over_this_same_round"] = ratios
        summary["engines"][n][f"{ref}_over_this_median"] = statistics.median(ratios)
        tpot = [a["tpot_ms"] / b["tpot_ms"] for a, b in zip(results[ref], results[n])]
        summary["engines"][n][f"{ref}_tpot_over_this_same_round"] = tpot
        summary["engines"][n][f"{ref}_tpot_over_this_median"] = statistics.median(tpot)
    print(json.dumps({k: v for k, v in summary.items()}, indent=2, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    if args.png:
        _chart(summary, wl.name, args.png)
    bad = [n for n, a in agree.items() if a < 0.9]
    if bad and args.dtype == "float32":
        raise SystemExit(f"engines {bad} disagree with {ref} on the first {CHECK_TOKENS['float32']} greedy tokens")
    if bad:
        raise SystemExit(f"engines {bad}: first token outside the float32 reference's near-ties "
                         f"(within {BF16_TIE_MARGIN} of the top logit)")


def _gemm_share(summary: dict, wl, dtype: str) -> None:
    """Each engine's FLOP rate over the workload (median round) against torch's GEMM rate, measured now."""
    from benchmarks.gemm_rate import default_config, torch_gemm_rate, workload_flops

    cfg = default_config()
    flops = workload_flops(cfg, wl.num_prompts, wl.prompt_len, wl.new_tokens)
    rate = torch_gemm_rate(cfg, getattr(torch, dtype))
    summary["workload_tflop"] = flops / 1e12
    summary["torch_gemm_gflops"] = rate
    for entry in summary["engines"].values():
        seconds = statistics.median(r["seconds"] for r in entry["rounds"])
        entry["gflops_median"] = flops / seconds / 1e9
        entry["share_of_torch_gemm_median"] = entry["gflops_median"] / rate["best_gflops"]
    print(f"{wl.name}: {flops / 1e12:.3f} TFLOP; torch {dtype} GEMM {rate['best_gflops']:.0f} GFLOP/s; " +
          ", ".join(f"{n} {e['gflops_median']:.0f} GFLOP/s ({e['share_of_torch_gemm_median']:.0%})"
                    for n, e in summary["engines"].items()), flush=True)


def _rounds(args, names, engines, prompts, wl, results, first_tokens) -> None:
    for r in range(args.rounds):
        order = names if r % 2 == 0 else list(reversed(names))  # alternate who runs first
        for n in order:
            # Peers' worker threads spin-wait for a while after a job (ggml's thread pool does); on 2 cores a
            # spinning idle peer would halve the next engine's speed. A pause lets them go to sleep.
            time.sleep(IDLE_PAUSE_S)
            tokens, seconds, extra = engines[n].run(prompts, wl.new_tokens)
            assert all(len(t) == wl.new_tokens for t in tokens), f"{n} produced the wrong number of tokens"
            first_tokens.setdefault(n, [t[:CHECK_TOKENS[args.dtype]] for t in tokens])
            results[n].append({"seconds": seconds, "tok_s": len(prompts) * wl.new_tokens / seconds,
                               "tpot_ms": _tpot_ms(seconds, extra.get("ttft_s"), wl.new_tokens), **extra})
            print(f"round {r} {n}: {results[n][-1]['tok_s']:.1f} output tok/s", flush=True)


def _engine(name: str, dtype: str):
    """An engine by name; rtp_llm@PATH is the rtp-llm checkout at PATH in a process of its own,
    rtp_llm_dequantized@PATH the same with a GGUF dequantized at load."""
    if name.startswith("rtp_llm@"):
        return RtpLLMCheckout(name.split("@", 1)[1], dtype=dtype)
    if name.startswith("rtp_llm_dequantized@"):
        return RtpLLMCheckout(name.split("@", 1)[1], dtype=dtype, quantization="none")
    return ENGINES[name](dtype=dtype)


def _fp32_near_ties(prompts, margin: float) -> list[set[int]]:
    """Per prompt, the tokens whose float32 transformers logit for the first output is within `margin` of the
    top one. bf16 engines legitimately pick any of them: the random-token prompts have near-flat logits (B1's
    top two differ by 0.011), which bf16 rounding reorders, differently in every engine."""
    from benchmarks.engines import Transformers

    model = Transformers("float32").model
    with torch.no_grad():
        logits = model(torch.tensor(prompts)).logits[:, -1].float()
    top = logits.max(-1, keepdim=True).values
    return [set(torch.nonzero(row >= t - margin).flatten().tolist()) for row, t in zip(logits, top)]


def _tpot_ms(seconds: float, ttft_s, new_tokens: int) -> float:
    """Time per output token after the first (the decode rate, prefill excluded), as vLLM's benchmarks
    define it; engines that report no first-token time get the whole run over the tokens."""
    if ttft_s is None or new_tokens < 2:
        return 1000 * seconds / new_tokens
    return 1000 * (seconds - ttft_s) / (new_tokens - 1)


def _chart(summary: dict, workload: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["engines"])
    med = [summary["engines"][n]["tok_s_median"] for n in names]
    lo = [m - summary["engines"][n]["tok_s_min"] for n, m in zip(names, med)]
    hi = [summary["engines"][n]["tok_s_max"] - m for n, m in zip(names, med)]
    tpot = [summary["engines"][n]["tpot_ms_median"] for n in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(names, med, yerr=[lo, hi], capsize=6, color="#4c72b0")
    a.set_ylabel("output tokens/s (median, min-max)")
    b.bar(names, tpot, color="#dd8452")
    b.set_ylabel("ms per output token after the first (median)")
    fig.suptitle(f"workload {workload}, {summary['dtype']}, {summary['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
