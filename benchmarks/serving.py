"""Serving benchmark against the HTTP server, like vLLM's: Poisson arrivals at a few request rates;
TTFT, TPOT and end-to-end latency p50/p99 per rate.

    python -m benchmarks.serving [--rates 0.5 1 2] [--requests 24] [--url http://127.0.0.1:8000]
                                 [--json out.json] [--png out.png]

Without --url it starts `python -m rtp_llm.start_server` on a free port (embedded model) and stops
it afterwards. Each request: a 128-token prompt (token ids, fixed seed), 64 new tokens, EOS ignored,
streamed through /v1/completions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time

import httpx

from benchmarks.workloads import Workload


def _pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else float("nan")


async def _one(http, url, prompt, new_tokens):
    body = {"prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    first = None
    chunks = 0
    async with http.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if first is None:
                    first = time.perf_counter()
                chunks += 1
    end = time.perf_counter()
    return {"ttft": first - t0, "e2e": end - t0, "tpot": (end - first) / max(1, new_tokens - 1)}


async def _rate(url, rate, prompts, new_tokens, seed):
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=256)) as http:
        tasks = []
        for p in prompts:
            tasks.append(asyncio.create_task(_one(http, url, p, new_tokens)))
            await asyncio.sleep(rng.expovariate(rate))
        return await asyncio.gather(*tasks)


def _start_server():
    import socket


    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rtp_llm.start_server", "--port", str(port), "--max_model_len",
                             "1024"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--url")
    ap.add_argument("--json")
    ap.add_argument("--png")
    args = ap.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = _start_server()
    try:
        prompts = Workload("serving", args.requests, 128, args.new_tokens).prompts()
        asyncio.run(_rate(url, 10.0, prompts[:2], 4, 0))  # warm-up
        results = []
        for rate in args.rates:
            rows = asyncio.run(_rate(url, rate, prompts, args.new_tokens, seed=int(rate * 1000)))
            summary = {"rate": rate}
            for key in ("ttft", "tpot", "e2e"):
                vals = [r[key] for r in rows]
                summary[f"{key}_p50_s"] = round(statistics.median(vals), 4)
                summary[f"{key}_p99_s"] = round(_pct(vals, 0.99), 4)
            results.append(summary)
            print(json.dumps(summary), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
        for ax, key, label in zip(axes, ("ttft", "tpot", "e2e"), ("TTFT (s)", "TPOT (s)", "end-to-end (s)")):
            ax.plot([r["rate"] for r in results], [r[f"{key}_p50_s"] for r in results], "o-", label="p50")
            ax.plot([r["rate"] for r in results], [r[f"{key}_p99_s"] for r in results], "s--", label="p99")
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle("rtp-llm serving, SmolLM2-135M fp32, 128 in / 64 out")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
