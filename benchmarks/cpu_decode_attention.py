"""The CPU paged decode-attention kernel on a W-like decode step: 32 sequences with 129-256 cached tokens,
SmolLM2's 9 query / 3 KV heads of 64, one cache per layer for 30 layers (so the step streams its KV from
memory as the engine does, ~280 MB in float32, on 2 MB pages as the engine allocates it). Reports ms per
step and the KV bytes read per second.

    python -m benchmarks.cpu_decode_attention [--batch 32] [--dtype float32 bfloat16] [--small-pages]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--min-len", type=int, default=129)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--in-order", action="store_true", help="each sequence's blocks consecutive, not shuffled")
    ap.add_argument("--small-pages", action="store_true",
                    help="caches on 4 KB pages (the engine puts them on 2 MB pages: CpuDevice.zeros)")
    ap.add_argument("--block-size", type=int, nargs="+", default=[16],
                    help="tokens per KV block; several: each in turn, alternating, in the same run")
    args = ap.parse_args()
    from rtp_llm._native import ops

    kernel = ops().paged_attention
    heads, kv_heads, dim = 9, 3, 64
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(args.min_len, args.max_len + 1, (args.batch,), generator=g)
    for name in args.dtype:
        dtype = getattr(torch, name)
        steps = {block: _step(kernel, args, block, lens, dtype, g, heads, kv_heads, dim) for block in args.block_size}
        times = {block: [] for block in steps}
        for r in range(args.repeats):
            for block in (args.block_size if r % 2 == 0 else args.block_size[::-1]):
                t = time.perf_counter()
                steps[block]()
                times[block].append(time.perf_counter() - t)
        kv_bytes = 2 * int(lens.sum()) * kv_heads * dim * torch.finfo(dtype).bits // 8 * args.layers
        for block, ts in times.items():
            ts.sort()
            best = ts[len(ts) // 2]
            print(f"{name}, blocks of {block}: {best * 1e3:.2f} ms per step (min {ts[0] * 1e3:.2f}, max "
                  f"{ts[-1] * 1e3:.2f}; {args.layers} layers, batch {args.batch}), KV {kv_bytes / 1e6:.0f} MB at "
                  f"{kv_bytes / best / 1e9:.1f} GB/s", flush=True)


def _step(kernel, args, block, lens, dtype, g, heads, kv_heads, dim):
    """One decode step's attention over every layer's cache, blocks of `block` tokens (warmed up once)."""
    width = (args.max_len + block - 1) // block
    blocks = args.batch * width
    # Blocks shuffled, as a cache that has served for a while hands them out.
    order = torch.arange(blocks) if args.in_order else torch.randperm(blocks, generator=g)
    table = order.to(torch.int32).reshape(args.batch, width)

    def cache():
        values = torch.randn(blocks, block, kv_heads, dim, generator=g).to(dtype)
        if args.small_pages:
            return values
        return torch.ops.rtp_llm.huge_page_zeros(list(values.shape), dtype).copy_(values)

    caches = [(cache(), cache()) for _ in range(args.layers)]
    q = torch.randn(args.batch, heads, dim, generator=g).to(dtype)

    def step():
        for k, v in caches:
            kernel(q, k, v, table, lens, dim ** -0.5)

    step()
    return step


if __name__ == "__main__":
    main()
