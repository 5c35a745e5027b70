"""CPU prefill attention: the C++ prefill kernel (rtp_llm/cpp/cpu/prefill_attention.cc, AVX-512) against what
CpuAttention runs without it, the paged decode kernel row by row (each row over its causal keys; the same bits).
SmolLM2's heads (9 query / 3 KV of 64), one layer, ms per call (median), and the prefill kernel's GFLOP/s (QK^T and
PV over each row's causal keys). The SDPA paths it was first measured against are gone (benchmarks/ARCHIVE.md).

    python -m benchmarks.cpu_prefill_attention [--dtype float32 bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--dtype", nargs="+", default=["float32"])
    args = ap.parse_args()
    from rtp_llm._native import ops

    if ops().cpu_isa() != "avx512":
        raise SystemExit("the prefill kernel needs AVX-512; this CPU runs every prefill row on the paged kernel")
    for name in args.dtype:
        _run(getattr(torch, name), args.repeats)


def _run(dtype: torch.dtype, repeats: int) -> None:
    from rtp_llm.cache import KVBuffer
    from rtp_llm.device.cpu.attention import CpuAttention
    from rtp_llm.device.forward_batch import ForwardBatch

    heads, kv_heads, dim, bs = 9, 3, 64, 16
    workloads = {"32 x 128 fresh (W's prefill)": ([128] * 32, [0] * 32),
                 "8 prompts of 60-900 tokens": ([100, 250, 400, 180, 333, 512, 60, 900], [0] * 8),
                 "4 suffixes of 200 after 300 cached": ([200] * 4, [300] * 4)}
    g = torch.Generator().manual_seed(0)
    for name, (q_lens, ctx) in workloads.items():
        widths = [(q + c + bs - 1) // bs for q, c in zip(q_lens, ctx)]
        table = torch.zeros(len(q_lens), max(widths), dtype=torch.int32)
        perm = torch.randperm(sum(widths), generator=g).to(torch.int32)
        at = 0
        for i, w in enumerate(widths):
            table[i, :w] = perm[at:at + w]
            at += w
        slots = [[int(table[i, j // bs]) * bs + j % bs for j in range(c, c + q)]
                 for i, (q, c) in enumerate(zip(q_lens, ctx))]
        batch = ForwardBatch.build([[1] * q for q in q_lens], ctx, slots, table.numpy(), bs)
        kv = KVBuffer(1, sum(widths), bs, kv_heads, dim, dtype=dtype)
        kv.buffer.normal_(generator=g)
        T = sum(q_lens)
        q, k, v = (torch.randn(T, n, dim, generator=g).to(dtype) for n in (heads, kv_heads, kv_heads))
        cpu = CpuAttention(heads, kv_heads, dim, dim ** -0.5, bs)
        paths = {"prefill kernel": True, "paged kernel per row": False}
        times = {p: [] for p in paths}
        outs = {}
        for _ in range(repeats):
            for p, on in paths.items():
                cpu.prefill_kernel = on
                meta = cpu.prepare(batch)
                t = time.perf_counter()
                outs[p] = cpu.forward(q, k, v, kv.layer(0), meta)
                times[p].append(time.perf_counter() - t)
        a, b = outs.values()
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        assert torch.allclose(a.float(), b.float(), atol=tol), (a.float() - b.float()).abs().max()
        med = [statistics.median(t) * 1e3 for t in times.values()]
        # each row attends to its context plus itself: QK^T and PV, 2 FLOPs per multiply-add
        flop = sum(4 * heads * dim * sum(c + j + 1 for j in range(q)) for q, c in zip(q_lens, ctx))
        print(f"{str(dtype).replace('torch.', '')} {name}: " + ", ".join(f"{p} {m:.2f} ms" for p, m in zip(paths, med))
              + f" ({med[1] / med[0]:.2f}x); prefill kernel {flop / med[0] / 1e6:.0f} GFLOP/s", flush=True)


if __name__ == "__main__":
    main()
