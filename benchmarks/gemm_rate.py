"""A workload's arithmetic against the machine's GEMM rate: issue 25's "share of the bf16 GEMM rate" measured in
the same run as the engines (benchmarks.run reports it for bfloat16 runs), or alone:

    python -m benchmarks.gemm_rate [--workload W]

workload_flops: the multiply-adds of the default model's linear layers for every token it processes (each prompt's
tokens, then one per generated token after the first), the LM head for every sampled row (one per output token),
and attention's QK^T and PV over each token's context; x2 for FLOPs. torch_gemm_rate: torch's best bf16 F.linear
rate here, on 2048^3 and on the model's own linear shapes at the prefill's row count.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F


def default_config():
    from transformers import AutoConfig

    from benchmarks.engines import default_model_path

    gguf = default_model_path()
    return AutoConfig.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))


def _linear_shapes(cfg) -> list[tuple[int, int]]:
    """(in, out) of one decoder layer's linear layers."""
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    return [(hidden, q + 2 * kv), (q, hidden), (hidden, 2 * inter), (inter, hidden)]


def workload_flops(cfg, num_prompts: int, prompt_len: int, new_tokens: int) -> float:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = sum(i * o for i, o in _linear_shapes(cfg)) * cfg.num_hidden_layers
    tokens = prompt_len + new_tokens - 1  # the last output token is sampled, never fed back
    # token t (0-based) attends to t + 1 positions: QK^T and PV, heads x head_dim each
    contexts = tokens * (tokens + 1) / 2
    attention = 2 * cfg.num_attention_heads * head_dim * contexts * cfg.num_hidden_layers
    head = cfg.vocab_size * cfg.hidden_size * new_tokens
    return 2.0 * num_prompts * (per_token * tokens + attention + head)


def torch_gemm_rate(cfg, dtype=torch.bfloat16, rows: int = 4096, seconds: float = 0.5) -> dict:
    """GFLOP/s of F.linear per shape (best of repeated calls over ~`seconds`), and the best of them."""
    rates = {}
    shapes = [("2048^3", 2048, 2048, 2048)] + [(f"{i}x{o}", rows, i, o) for i, o in _linear_shapes(cfg)]
    for name, m, k, n in shapes:
        x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
        F.linear(x, w)
        best, start = float("inf"), time.perf_counter()
        while time.perf_counter() - start < seconds:
            t = time.perf_counter()
            F.linear(x, w)
            best = min(best, time.perf_counter() - t)
        rates[name] = 2 * m * k * n / best / 1e9
    return {"per_shape_gflops": rates, "best_gflops": max(rates.values())}


def main() -> None:
    from benchmarks.workloads import WORKLOADS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="W", choices=sorted(WORKLOADS))
    args = ap.parse_args()
    wl, cfg = WORKLOADS[args.workload], default_config()
    flops = workload_flops(cfg, wl.num_prompts, wl.prompt_len, wl.new_tokens)
    rate = torch_gemm_rate(cfg)
    print(f"{wl.name}: {flops / 1e12:.3f} TFLOP; torch bf16 F.linear " +
          ", ".join(f"{k} {v:.0f}" for k, v in rate["per_shape_gflops"].items()) + " GFLOP/s")
    print(f"at the best rate ({rate['best_gflops']:.0f} GFLOP/s) {wl.name} would take "
          f"{flops / rate['best_gflops'] / 1e9:.2f} s: {wl.num_prompts * wl.new_tokens * rate['best_gflops'] * 1e9 / flops:.0f} "
          "output tok/s")


if __name__ == "__main__":
    main()
