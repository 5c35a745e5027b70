"""The CPU linear layers: F.linear (MKL; packs the weight on every call) against the oneDNN-packed weights
CpuOps uses, and the GEMV kernel on few rows, at SmolLM2's shapes. Same process, alternating, GFLOP/s.

    python -m benchmarks.cpu_linear [--rows 1 4 32 4096]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576), "lm_head": (576, 49152)}


def _time(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 32, 4096])
    args = ap.parse_args()
    from rtp_llm._native import ops

    kernels = ops()
    print(f"threads {torch.get_num_threads()}")
    for rows in args.rows:
        for name, (k, n) in SHAPES.items():
            if name == "lm_head" and rows > 256:
                continue  # the LM head only sees sampled rows
            x, w = torch.randn(rows, k), torch.randn(n, k)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 32)
            reps = max(3, int(2e9 / (2 * rows * k * n)))
            flop = 2 * rows * k * n / 1e9
            t_mkl = _time(lambda: F.linear(x, w), reps)
            t_dnn = _time(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), reps)
            line = f"rows {rows:5d} {name:8s} F.linear {flop / t_mkl:6.1f}  oneDNN packed {flop / t_dnn:6.1f}"
            if rows <= 4:
                line += f"  GEMV kernel {flop / _time(lambda: kernels.skinny_linear(x, w), reps):6.1f}"
            print(line + f"  GFLOP/s  (packed / F.linear {t_mkl / t_dnn:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
