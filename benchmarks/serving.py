"""Serving benchmark against the HTTP server, like vLLM's: Poisson arrivals at a few request rates;
TTFT, TPOT and end-to-end latency p50/p99 per rate.

    python -m benchmarks.serving [--rates 0.5 1 2] [--requests 24] [--repeats 1] [--servers rtp_llm,vllm]
                                 [--url http://127.0.0.1:8000] [--json out.json] [--png out.png]

Without --url it starts every server of --servers on a free port (rtp_llm: `python -m rtp_llm.start_server`
on the embedded model; vllm: vLLM's OpenAI server from its venv, see benchmarks/peers/setup_vllm.sh, on the
float32 export of the same weights), then runs each rate on each server in alternating order (the others
idle: two loaded servers on 2 cores would measure each other), and stops them. Each request: a 128-token
prompt (token ids, fixed seed), 64 new tokens, EOS ignored, streamed through /v1/completions.
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


async def _one(http, url, model, prompt, new_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
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
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        tasks = []
        for p in prompts:
            tasks.append(asyncio.create_task(_one(http, url, model, p, new_tokens)))
            await asyncio.sleep(rng.expovariate(rate))
        return await asyncio.gather(*tasks)


def _start_server(kind: str):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if kind == "rtp_llm":
        cmd, env = [sys.executable, "-m", "rtp_llm.start_server", "--port", str(port), "--max_model_len", "1024"], None
    elif kind == "vllm":
        from benchmarks.engines import vllm_environment
        from benchmarks.peers.export_hf import export

        python, env = vllm_environment()
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", export(), "--port", str(port),
               "--dtype", "float32", "--max-model-len", "1024", "--served-model-name", "SmolLM2-135M-Instruct"]
    else:
        raise SystemExit(f"unknown server {kind!r}: rtp_llm or vllm")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    return proc, wait_healthy(proc, f"http://127.0.0.1:{port}", kind)


def wait_healthy(proc, url: str, kind: str) -> str:
    """Waits until the server at url answers /health with 200; SystemExit if it exits or never does."""
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"the {kind} server exited with {proc.returncode}: {' '.join(map(str, proc.args))}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the {kind} server did not start")


def _summarise(rate, rows) -> dict:
    summary = {"rate": rate}
    for key in ("ttft", "tpot", "e2e"):
        vals = [r[key] for r in rows]
        summary[f"{key}_p50_s"] = round(statistics.median(vals), 4)
        summary[f"{key}_p99_s"] = round(_pct(vals, 0.99), 4)
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="runs per (server, rate); the median run is reported")
    ap.add_argument("--url", help="an already running server (instead of --servers)")
    ap.add_argument("--servers", default="rtp_llm", help="comma-separated: rtp_llm, vllm")
    ap.add_argument("--json")
    ap.add_argument("--png")
    args = ap.parse_args()
    prompts = Workload("serving", args.requests, 128, args.new_tokens).prompts()
    kinds = [args.url] if args.url else [k.strip() for k in args.servers.split(",") if k.strip()]
    # Every server is started first and stays up, idle, while another is measured; each rate then runs on
    # every server in alternating order, so slow drifts of a shared machine do not land on one server.
    servers = {}
    try:
        for kind in kinds:
            servers[kind] = (None, kind) if args.url else _start_server(kind)
            asyncio.run(_rate(servers[kind][1], 10.0, prompts[:2], 4, 0))  # warm-up
        runs = {k: {rate: [] for rate in args.rates} for k in kinds}
        for i, rate in enumerate(args.rates):
            for rep in range(args.repeats):
                order = kinds if (i + rep) % 2 == 0 else kinds[::-1]
                for kind in order:
                    time.sleep(1.0)  # the previous server's threads go idle
                    rows = asyncio.run(_rate(servers[kind][1], rate, prompts, args.new_tokens, seed=int(rate * 1000)))
                    runs[kind][rate].append(_summarise(rate, rows))
                    print(f"# {kind} " + json.dumps(runs[kind][rate][-1]), flush=True)
    finally:
        for proc, _ in servers.values():
            if proc is not None:
                proc.terminate()
                proc.wait(60)
    # the run with the median p99 TTFT per (server, rate)
    all_results = {k: [sorted(rs, key=lambda r: r["ttft_p99_s"])[len(rs) // 2] for rs in runs[k].values()]
                   for k in kinds}
    results = all_results
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
        for ax, key, label in zip(axes, ("ttft", "tpot", "e2e"), ("TTFT (s)", "TPOT (s)", "end-to-end (s)")):
            for name, rows in results.items():
                ax.plot([r["rate"] for r in rows], [r[f"{key}_p50_s"] for r in rows], "o-", label=f"{name} p50")
                ax.plot([r["rate"] for r in rows], [r[f"{key}_p99_s"] for r in rows], "s--", label=f"{name} p99")
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle("serving, SmolLM2-135M fp32, 128 in / 64 out")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
