"""Soak: the real server under mixed load for a while, watched for leaks.

    python -m benchmarks.soak [--minutes 10] [--concurrency 8] [--model PATH] [--url URL]

Clients loop over a mix: streamed and plain chat and completions, n > 1, stop strings, structured outputs,
clients that disconnect mid-stream or time out (aborts), and bad inputs (which must be 4xx). Reported per minute:
requests by status class, p50 / p99 TTFT (streams, client side) and TPOT, the server's and engine process's RSS;
at the end, after the load stops: leaked KV blocks (must be 0: nothing running, KV usage 0) and the RSS growth
after the first minute (warm-up). Without --url it starts the server itself on the embedded model.
tests/server/test_soak.py runs a short version in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

MIX = ("chat_stream", "chat", "completion_stream", "completion_n", "stop", "json", "disconnect", "timeout", "bad")


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _mb(xs: list[float]) -> list:
    return [None if x != x else round(x) for x in xs]  # NaN: the process is gone


def gauge(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


async def one(http: httpx.AsyncClient, url: str, kind: str, rng: random.Random, stats: dict) -> None:
    chat = {"messages": [{"role": "user", "content": f"Tell me about the number {rng.randint(0, 999)}."}]}
    t0 = time.monotonic()
    status, first, tokens = None, None, 0
    try:
        if kind in ("chat_stream", "completion_stream", "disconnect"):
            path = "/v1/chat/completions" if kind != "completion_stream" else "/v1/completions"
            body = {**(chat if "chat" in path else {"prompt": "Once upon a time"}), "stream": True,
                    "max_tokens": rng.randint(8, 48), "temperature": 0.8, "seed": rng.randint(0, 99)}
            async with http.stream("POST", url + path, json=body) as r:
                status = r.status_code
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        tokens += 1
                        first = first or time.monotonic()
                        if kind == "disconnect" and tokens == 3:
                            stats["aborted"] += 1
                            break
        elif kind == "timeout":
            try:
                r = await http.post(url + "/v1/completions", json={"prompt": "Long story:", "max_tokens": 200,
                                                                   "ignore_eos": True}, timeout=0.5)
                status = r.status_code
            except httpx.TimeoutException:
                stats["aborted"] += 1
                return
        elif kind == "bad":
            body = rng.choice([{"messages": []}, {"messages": chat["messages"], "temperature": 9},
                               {"prompt": "x", "max_tokens": 0}, {"messages": [{"role": "user", "content": "\udcff"}]},
                               {"prompt": [10 ** 9]}])
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            r = await http.post(url + path, content=json.dumps(body), headers={"content-type": "application/json"})
            status = r.status_code
            if not 400 <= status < 500:
                stats["bad_not_4xx"] += 1
        else:
            if kind == "completion_n":
                path, body = "/v1/completions", {"prompt": "A list of fruits:", "n": 3, "max_tokens": 24,
                                                 "temperature": 1.0}
            elif kind == "stop":
                path, body = "/v1/completions", {"prompt": "Count: 1, 2, 3,", "stop": [","], "max_tokens": 32}
            elif kind == "json":
                path, body = "/v1/chat/completions", {**chat, "max_tokens": 64, "response_format": {
                    "type": "json_schema", "json_schema": {"name": "n", "schema": {
                        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}}
            else:
                path, body = "/v1/chat/completions", {**chat, "max_tokens": rng.randint(8, 48)}
            r = await http.post(url + path, json=body)
            status = r.status_code
            if status == 200:
                tokens = r.json()["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        stats["client_errors"].append(f"{kind}: {type(exc).__name__}")
        return
    finally:
        if status is not None:
            stats["status"][status // 100] = stats["status"].get(status // 100, 0) + 1
    if first is not None:
        stats["ttft"].append(first - t0)
        if tokens > 1:
            stats["tpot"].append((time.monotonic() - first) / (tokens - 1))


def _pct(xs, q):
    return round(statistics.quantiles(xs, n=100)[q - 1], 4) if len(xs) >= 2 else None


async def run_load(url: str, seconds: float, concurrency: int, pids: list[int], seed: int = 0,
                   report=print) -> dict:
    rng = random.Random(seed)
    total = {"status": {}, "aborted": 0, "bad_not_4xx": 0, "client_errors": []}
    rss: list[list[float]] = []
    end = time.monotonic() + seconds
    minute = {"ttft": [], "tpot": [], "status": {}, "aborted": 0, "bad_not_4xx": 0, "client_errors": []}

    async def worker(i):
        r = random.Random(rng.random())
        while time.monotonic() < end:
            await one(http, url, r.choice(MIX), r, minute)

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency + 4)) as http:
        tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        t_start = time.monotonic()
        gone: list[int] = []
        while any(not t.done() for t in tasks):
            await asyncio.sleep(min(60.0, max(1.0, seconds / 4)))
            rss.append([rss_mb(p) for p in pids])
            gone = [p for p, x in zip(pids, rss[-1]) if x != x]
            m, minute = minute, {"ttft": [], "tpot": [], "status": {}, "aborted": 0, "bad_not_4xx": 0,
                                 "client_errors": []}
            for k in ("aborted", "bad_not_4xx"):
                total[k] += m[k]
            total["client_errors"] += m["client_errors"]
            for k, v in m["status"].items():
                total["status"][k] = total["status"].get(k, 0) + v
            report(json.dumps({"t_s": round(time.monotonic() - t_start), "status": m["status"],
                               "ttft_p50": _pct(m["ttft"], 50), "ttft_p99": _pct(m["ttft"], 99),
                               "tpot_p50": _pct(m["tpot"], 50), "tpot_p99": _pct(m["tpot"], 99),
                               "rss_mb": _mb(rss[-1])}))
            if gone:  # a server or engine process died: no point loading it further (the caller reads its log)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                summary = {"seconds": seconds, "status": total["status"], "gone": gone}
                report(json.dumps({"summary": summary}))
                return summary
        await asyncio.gather(*tasks)
        # After the load: every request finished or aborted, nothing may hold a block.
        for _ in range(100):
            text = (await http.get(url + "/metrics")).text
            running, usage = gauge(text, "rtp_llm_num_requests_running"), gauge(text, "rtp_llm_kv_cache_usage_ratio")
            if running == 0 and usage == 0:
                break
            await asyncio.sleep(0.2)
    growth = [round(b - a, 1) for a, b in zip(rss[0], rss[-1])] if len(rss) > 1 else [0.0] * len(pids)
    summary = {"seconds": seconds, "status": total["status"], "gone": [], "aborted": total["aborted"],
               "bad_not_4xx": total["bad_not_4xx"], "client_errors": total["client_errors"][:10],
               "leaked": {"running": running, "kv_usage": usage}, "rss_mb_first": _mb(rss[0]),
               "rss_mb_last": _mb(rss[-1]), "rss_growth_mb_after_warmup": growth}
    report(json.dumps({"summary": summary}))
    return summary


def start_server(*args: str) -> tuple[subprocess.Popen, str, list[int], str]:
    """The real server on a free port: (process, url, [server pid, engine pid], log path)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "rtp_llm.start_server", "--port", str(port), *args],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(open(log.name).read()[-3000:])
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    engine = re.search(r"engine process pid (\d+)", open(log.name).read())
    return proc, url, [proc.pid] + ([int(engine.group(1))] if engine else []), log.name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--model", default=None)
    ap.add_argument("--url", default=None, help="a running server (its RSS is not watched)")
    args = ap.parse_args()
    proc = None
    if args.url:
        url, pids = args.url, []
    else:
        extra = ["--model", args.model] if args.model else []
        proc, url, pids, _ = start_server(*extra, "--max_model_len", "1024", "--kv_cache_memory_gb", "0.25")
    try:
        summary = asyncio.run(run_load(url, args.minutes * 60, args.concurrency, pids))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    ok = not summary["gone"] and summary["status"].get(5, 0) == 0 and summary["leaked"]["running"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
