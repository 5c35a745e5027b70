"""The CPU linear layers: F.linear (MKL; packs the weight on every call) against the oneDNN-packed weights
CpuOps uses, and the GEMV kernel on few rows, at SmolLM2's shapes. Same process, alternating, GFLOP/s.

    python -m benchmarks.cpu_linear [--rows 1 4 32 4096]
    python -m benchmarks.cpu_linear --stream [--dtype float32 bfloat16]

The default mode repeats one weight, which then sits in cache. --stream runs the four linear layers of
30 layers with their own weights (425 MB in fp32), as a decode step does, so the weights stream from
memory: packed GEMM vs the GEMV kernel at 1-16 rows, ms per 30 layers and weight GB/s.
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
    ap.add_argument("--stream", action="store_true", help="30 layers of weights streamed from memory")
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], help="with --stream")
    args = ap.parse_args()
    from rtp_llm._native import ops

    kernels = ops()
    if args.stream:
        return _stream(kernels, args.dtype)
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


def _stream(kernels, dtypes, layers: int = 30) -> None:
    names = [n for n in SHAPES if n != "lm_head"]
    for name in dtypes:
        dtype = getattr(torch, name)
        weights = [[torch.randn(SHAPES[n][1], SHAPES[n][0]).to(dtype) for n in names] for _ in range(layers)]
        packed = [[torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in ws] for ws in weights]
        gb = sum(w.numel() * w.element_size() for ws in weights for w in ws) / 1e9
        for rows in (1, 2, 4, 8, 10, 12, 16):
            xs = [torch.randn(rows, SHAPES[n][0]).to(dtype) for n in names]

            def gemv():
                for ws in weights:
                    for x, w in zip(xs, ws):
                        kernels.skinny_linear(x, w)

            def gemm():
                for ps in packed:
                    for x, p in zip(xs, ps):
                        torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")

            t_gemv, t_gemm = _time(gemv, 5), _time(gemm, 5)
            print(f"{name} rows {rows}: GEMV kernel {t_gemv * 1e3:6.2f} ms ({gb / t_gemv:5.1f} GB/s)  "
                  f"oneDNN packed {t_gemm * 1e3:6.2f} ms ({gb / t_gemm:5.1f} GB/s)", flush=True)


if __name__ == "__main__":
    main()
