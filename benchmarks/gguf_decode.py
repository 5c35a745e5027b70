"""Batch-1 decode on the embedded default GGUF as stored: llama.cpp's llama-bench (tg128 on the same Q4_1 file, 2
threads) against rtp_llm's B1 (128 in, 128 out) with the file's blocks in memory and with it dequantized, in
alternating rounds. Needs the llama.cpp peer build (bash benchmarks/peers/setup_llamacpp.sh).

    python -m benchmarks.gguf_decode [--rounds 5] [--llama-bench .venv-llamacpp/build/bin/llama-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

from benchmarks.engines import RtpLLM, RtpLLMDequantized, peer_environ
from benchmarks.workloads import WORKLOADS
from rtp_llm.models.default_model import default_model_path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--llama-bench", default=os.path.join(_ROOT, ".venv-llamacpp", "build", "bin", "llama-bench"))
    args = ap.parse_args()
    if not os.path.exists(args.llama_bench):
        raise SystemExit(f"{args.llama_bench} missing: bash benchmarks/peers/setup_llamacpp.sh")
    gguf, w = default_model_path(), WORKLOADS["B1"]
    prompts = w.prompts()
    engines = {"rtp_llm": RtpLLM(), "rtp_llm_dequantized": RtpLLMDequantized()}
    for e in engines.values():
        e.run(prompts, 8)  # warm-up
    tpot = {k: [] for k in ["llama.cpp tg128"] + list(engines)}
    for r in range(args.rounds):
        out = subprocess.run([args.llama_bench, "-m", gguf, "-t", "2", "-p", "0", "-n", str(w.new_tokens), "-r", "1",
                              "-o", "json"], capture_output=True, text=True, check=True, env=peer_environ()).stdout
        tpot["llama.cpp tg128"].append(1000.0 / json.loads(out)[0]["avg_ts"])
        for name, e in engines.items():
            _, total, extra = e.run(prompts, w.new_tokens)
            tpot[name].append((total - extra["ttft_s"]) / (w.new_tokens - 1) * 1000)
        print(f"round {r}:", {k: round(v[-1], 2) for k, v in tpot.items()}, flush=True)
    for k, v in tpot.items():
        print(f"{k}: TPOT ms min / median / max {min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f}")
    for name in engines:
        ratios = [a / b for a, b in zip(tpot[name], tpot["llama.cpp tg128"])]
        print(f"{name} / llama.cpp, same round:", " / ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
