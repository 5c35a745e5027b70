"""The CPU linear layers at SmolLM2's shapes, same process, alternating: F.linear (MKL; packs the weight on
every call), oneDNN's packed GEMM (the kernel CpuOps used before the panel kernel, and still uses for bf16 and
on CPUs without AVX2), the plain-layout GEMV kernel on few rows, and the panel kernel (AVX-512 or AVX2).

    python -m benchmarks.cpu_linear [--rows 1 4 32 4096] [--dtype float32 bfloat16]
    python -m benchmarks.cpu_linear --stream [--dtype float32 bfloat16] [--stream-rows 1 8 16 32 64]
    python -m benchmarks.cpu_linear --gated [--dtype float32 bfloat16] [--rows 1 32 512]
    python -m benchmarks.cpu_linear --quant [--formats Q4_1 Q8_0] [--rows 32] [--model-shapes qwen2.5-0.5b]
        [--names qkv o gate_up down] [--ops OTHER/_ops.so]

The default mode repeats one weight, which then sits in cache (GFLOP/s; with --dtype bfloat16 the same kinds in bf16:
torch's and oneDNN's bf16 GEMMs against the bf16 pair panels, shape by shape). --stream runs the four linear layers
of 30 layers with their own weights (425 MB in fp32), as a decode step does, so the weights stream from
memory: ms per 30 layers and weight GB/s, each kernel in turn over 3 rounds (min-max). --gated times SmolLM2's
gate_up + SiLU as the two ops on ordinary panels (panel_linear, then silu_and_mul) against panel_linear_silu on
gated panels (the SiLU in the GEMM's epilogue, the same bits), alternating, best of 4 x 30 calls. --quant times
quant_linear on GGUF blocks (the gguf package's quantizer on random weights; SmolLM2's shapes) against the fp32 panel
kernel and torch's fp32 GEMM (F.linear) on the same matrix dequantized, GFLOP/s with copies streamed past the L3 and
with one copy in cache (quant_linear and the panels give the same sums bit for bit: the blocks decoded into fp32
panels, then the dense panels' tiles); the k-quants (which gguf cannot
quantize) as random blocks with realistic scales; --model-shapes qwen2.5-0.5b uses Qwen2.5-0.5B's shapes and its
151,936-row head; --ops times another build of the kernels (an A/B of two builds is two runs, alternated by hand).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from rtp_llm.device.cpu.linear import onednn_bf16

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576), "lm_head": (576, 49152)}
QWEN_SHAPES = {"qkv": (896, 1152), "o": (896, 896), "gate_up": (896, 9728), "down": (4864, 896),
               "lm_head": (896, 151936)}  # (in, out): Qwen2.5-0.5B


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
    ap.add_argument("--gated", action="store_true", help="gate_up + SiLU: two ops vs the fused kernel")
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"],
                    help="with --stream or --gated (default both); the in-cache mode: float32 unless given")
    ap.add_argument("--stream-rows", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16, 24, 32, 48, 64])
    ap.add_argument("--quant", action="store_true", help="GGUF blocks (quant_linear) vs dequantized fp32 panels")
    ap.add_argument("--formats", nargs="+", default=["Q4_1", "Q8_0"], help="with --quant")
    ap.add_argument("--model-shapes", choices=["smollm2", "qwen2.5-0.5b"], default="smollm2", help="with --quant")
    ap.add_argument("--names", nargs="+", help="with --quant: only these shapes (qkv o gate_up down lm_head)")
    ap.add_argument("--ops", help="with --quant: this _ops.so instead of rtp_llm's (another build, for an A/B)")
    args = ap.parse_args()
    from rtp_llm._native import ops

    if args.ops:
        torch.ops.load_library(args.ops)
        kernels = torch.ops.rtp_llm
    else:
        kernels = ops()
    if args.stream:
        return _stream(kernels, args.dtype, args.stream_rows)
    if args.gated:
        return _gated(kernels, args.dtype, args.rows)
    if args.quant:
        return _quant(kernels, args.formats, args.rows if args.rows != ap.get_default("rows") else [32],
                      {n: s for n, s in (QWEN_SHAPES if args.model_shapes == "qwen2.5-0.5b" else SHAPES).items()
                       if not args.names or n in args.names})
    _in_cache(kernels, args.dtype if "--dtype" in sys.argv else ["float32"], args.rows)


def _in_cache(kernels, dtypes, row_counts) -> None:
    """GFLOP/s per shape with the weight in cache: F.linear, oneDNN's packed copy, the GEMV kernel (<= 4 rows) and
    the panel kernel (bf16: pair panels on vdpbf16ps), same process, best of 3 alternating rounds."""
    print(f"threads {torch.get_num_threads()}")
    for name in dtypes:
        dtype = getattr(torch, name)
        panel = kernels.cpu_isa() in ("avx512", "avx2")  # the AVX2 panels where the CPU lacks AVX-512 / avx512_bf16
        for rows in row_counts:
            for shape, (k, n) in SHAPES.items():
                if shape == "lm_head" and rows > 256:
                    continue  # the LM head only sees sampled rows
                x, w = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype)
                kinds = {"F.linear": lambda: F.linear(x, w)}
                if dtype == torch.float32 or onednn_bf16():  # oneDNN packs bf16 only with avx512bw or avx_ne_convert
                    packed = torch.ops.mkldnn._reorder_linear_weight(w, 32)
                    kinds["oneDNN packed"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                if rows <= 4:
                    kinds["GEMV kernel"] = lambda: kernels.gemv(x, w)
                if panel:
                    panels = kernels.pack_panels(w)
                    kinds["panel kernel"] = lambda: kernels.panel_linear(x, panels, None, n)
                reps = max(3, int(2e9 / (2 * rows * k * n)))
                best = {kind: float("inf") for kind in kinds}
                for _ in range(3):
                    for kind, fn in kinds.items():
                        best[kind] = min(best[kind], _time(fn, reps))
                flop = 2 * rows * k * n / 1e9
                print(f"{name} rows {rows:5d} {shape:8s} " + "  ".join(f"{kind} {flop / t:6.1f}"
                                                                       for kind, t in best.items())
                      + f"  GFLOP/s  (fastest: {min(best, key=best.get)})", flush=True)


def _gated(kernels, dtypes, row_counts) -> None:
    k, n = SHAPES["gate_up"]
    for name in dtypes:
        dtype = getattr(torch, name)
        if kernels.cpu_isa() != "avx512" or (dtype == torch.bfloat16 and not kernels.cpu_avx512_bf16()):
            print(f"{name}: no panels on this CPU")
            continue
        w = torch.randn(n, k).to(dtype)
        plain, gated = kernels.pack_panels(w), kernels.pack_gated_panels(w)
        for rows in row_counts:
            x = torch.randn(rows, k).to(dtype)
            fns = {"two ops": lambda: kernels.silu_and_mul(kernels.panel_linear(x, plain, None, n)),
                   "fused": lambda: kernels.panel_linear_silu(x, gated, None, n // 2)}
            assert torch.equal(fns["two ops"](), fns["fused"]())
            best = {label: min(_time(fn, 30) for _ in range(4)) for label, fn in fns.items()}
            print(f"{name} rows {rows:5d}: two ops {best['two ops'] * 1e3:7.3f} ms  fused {best['fused'] * 1e3:7.3f} ms"
                  f"  ({best['two ops'] / best['fused']:.3f}x)", flush=True)


def _random_blocks(fmt: str, n: int, k: int):
    """[n, k] weights as `fmt` blocks: gguf's quantizer on normal weights, or (the k-quants, which it cannot
    write) random bytes whose fp16 scales are set to realistic values."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    kind = getattr(GGMLQuantizationType, fmt)
    per, size = GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(0)
    if fmt.endswith("_K"):
        raw = rng.integers(0, 256, size=(n * k // per, size), dtype=np.uint8)
        for at in ([208] if fmt == "Q6_K" else [0, 2]):
            raw[:, at:at + 2] = rng.uniform(0.002, 0.02, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    else:
        raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), kind)
    return torch.from_numpy(np.ascontiguousarray(raw)).view(n, -1, size)


def _quant(kernels, formats, row_counts, shapes, copies_bytes: float = 150e6, rounds: int = 3) -> None:
    for fmt in formats:
        for name in shapes:
            k, n = shapes[name]
            if k % (256 if fmt.endswith("_K") else 32):
                continue  # llama.cpp writes such a matrix in another format
            blocks = _random_blocks(fmt, n, k)
            dense = kernels.quant_dequantize(blocks)
            panels = kernels.pack_panels(dense)
            blocks = kernels.quant_pack([blocks])  # as the CPU planner holds them
            qs = [blocks.clone() for _ in range(int(copies_bytes // blocks.numel()) + 1)]
            ps = [panels.clone() for _ in range(int(copies_bytes // (panels.numel() * 4)) + 1)]
            ds = [dense.clone() for _ in range(len(ps))]
            for rows in row_counts:
                x, flop = torch.randn(rows, k), 2 * rows * k * n / 1e9

                def rate(fn, items):
                    best = float("inf")
                    for _ in range(rounds):
                        t = time.perf_counter()
                        for it in items:
                            fn(it)
                        best = min(best, (time.perf_counter() - t) / len(items))
                    return flop / best

                q_s = rate(lambda b: kernels.quant_linear(x, b, None, n), qs)
                q_c = rate(lambda b: kernels.quant_linear(x, qs[0], None, n), qs)
                p_s = rate(lambda p: kernels.panel_linear(x, p, None, n), ps)
                p_c = rate(lambda p: kernels.panel_linear(x, ps[0], None, n), ps)
                t_s = rate(lambda d: F.linear(x, d), ds)
                t_c = rate(lambda d: F.linear(x, ds[0]), ds)
                print(f"{fmt} {name:8s} rows {rows:3d}: quant_linear {q_s:5.0f} streamed {q_c:5.0f} in cache  "
                      f"fp32 panels (dequantized) {p_s:5.0f} streamed {p_c:5.0f} in cache  "
                      f"torch F.linear (dequantized) {t_s:5.0f} streamed {t_c:5.0f} in cache  GFLOP/s", flush=True)


def _stream(kernels, dtypes, row_counts, layers: int = 30, rounds: int = 3) -> None:
    names = [n for n in SHAPES if n != "lm_head"]
    panel_on = torch.ops.rtp_llm.cpu_isa() in ("avx512", "avx2")
    gemv_rows = 16  # the GEMV kernel's limit (rtp_llm/cpp/cpu/ops.h: kGemvMaxRows)
    for name in dtypes:
        dtype = getattr(torch, name)
        weights = [[torch.randn(SHAPES[n][1], SHAPES[n][0]).to(dtype) for n in names] for _ in range(layers)]
        # oneDNN packs bf16 only with avx512bw or avx_ne_convert
        packed = ([[torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in ws] for ws in weights]
                  if dtype == torch.float32 or onednn_bf16() else None)
        on = panel_on
        panels = [[torch.ops.rtp_llm.pack_panels(w) for w in ws] for ws in weights] if on else None
        outs = [SHAPES[n][1] for n in names]
        gb = sum(w.numel() * w.element_size() for ws in weights for w in ws) / 1e9
        for rows in row_counts:
            xs = [torch.randn(rows, SHAPES[n][0]).to(dtype) for n in names]

            def gemv():
                for ws in weights:
                    for x, w in zip(xs, ws):
                        kernels.gemv(x, w)

            def gemm():
                for ps in packed:
                    for x, p in zip(xs, ps):
                        torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")

            def panel():
                for ps in panels:
                    for x, p, n in zip(xs, ps, outs):
                        torch.ops.rtp_llm.panel_linear(x, p, None, n)

            kinds = {"oneDNN packed": gemm} if packed is not None else {}
            if rows <= gemv_rows:
                kinds["GEMV kernel"] = gemv
            if panels is not None:
                kinds["panel kernel"] = panel
            times = {k: [] for k in kinds}
            for _ in range(rounds):
                for k, fn in kinds.items():
                    times[k].append(_time(fn, 2))
            print(f"{name} rows {rows:3d}: " + "  ".join(
                f"{k} {min(t) * 1e3:6.2f}-{max(t) * 1e3:6.2f} ms ({gb / min(t):5.1f} GB/s)" for k, t in times.items()),
                flush=True)


if __name__ == "__main__":
    main()
