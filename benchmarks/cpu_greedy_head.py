"""Greedy steps' LM head on CPU: the bf16 screen with exact recompute (CpuOps.greedy_tokens,
rtp_llm/cpp/cpu/greedy_head.cc) against the fp32 panel-kernel logits + argmax it replaces, on SmolLM2's
head shape (49152 x 576), for a few row counts; checks both give the same ids. Reports ms per call
(median), the head streamed from memory between calls as in a decode step.

    python -m benchmarks.cpu_greedy_head [--rows 1 8 32 64] [--quant]

--quant: the same head as GGUF Q8_0 blocks (quant_pack: the embedded default's tied head): quant_linear's logits
+ argmax against quant_greedy_head (bf16 weights decoded from the blocks per panel, no copy).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quant", action="store_true", help="the head as packed Q8_0 blocks")
    args = ap.parse_args()
    from rtp_llm._native import ops

    k = ops()
    if not k.cpu_avx512_bf16():
        raise SystemExit("this CPU has no AVX-512 + avx512_bf16: the screen is off here")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(args.vocab, args.hidden, generator=g) * 0.05
    if args.quant:
        import numpy as np
        from gguf import GGMLQuantizationType, quants

        raw = np.ascontiguousarray(quants.quantize(w.numpy(), GGMLQuantizationType.Q8_0))
        packed = k.quant_pack([torch.from_numpy(raw).view(args.vocab, -1, 34)])
        w = k.quant_packed_rows(packed, torch.arange(args.vocab), args.vocab)  # the values the blocks hold
        qbounds = k.quant_greedy_bounds(packed, args.vocab)
        full_fn = lambda h: k.quant_linear(h, packed, None, args.vocab).argmax(dim=-1)  # noqa: E731
        screen_fn = lambda h: k.quant_greedy_head(h, packed, qbounds, args.vocab)  # noqa: E731
    else:
        panels = k.pack_panels(w)
        screen, bounds = k.pack_greedy_screen(w)
        full_fn = lambda h: k.panel_linear(h, panels, None, args.vocab).argmax(dim=-1)  # noqa: E731
        screen_fn = lambda h: k.greedy_head(h, screen, bounds, w)  # noqa: E731
    flush = torch.empty(64 << 20, dtype=torch.uint8)  # 64 MB touched between calls: the head leaves the caches
    for rows in args.rows:
        # Hidden states aimed at vocab rows, as a trained model's are (random ones give flat logits).
        h = w[torch.randint(0, args.vocab, (rows,), generator=g)] * 40 + torch.randn(rows, args.hidden, generator=g)
        full = full_fn(h)
        assert torch.equal(screen_fn(h), full)
        times = {"full": [], "screen": []}
        for _ in range(args.repeats):
            for name in times:
                flush.fill_(1)
                t = time.perf_counter()
                (full_fn if name == "full" else screen_fn)(h)
                times[name].append(time.perf_counter() - t)
        f, s = statistics.median(times["full"]) * 1e3, statistics.median(times["screen"]) * 1e3
        print(f"{rows:3d} rows: {'Q8_0' if args.quant else 'fp32'} logits + argmax {f:.2f} ms, bf16 screen + exact "
              f"recompute {s:.2f} ms "
              f"({f / s:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
