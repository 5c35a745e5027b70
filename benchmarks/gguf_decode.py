"""A GGUF file as stored against llama.cpp on the same file, 2 threads, rounds alternating. Needs the llama.cpp peer
build (bash benchmarks/peers/setup_llamacpp.sh).

B1: llama-bench tg128 against rtp_llm's B1 (128 in, 128 out) with the file's blocks in memory and dequantized.
W:  llama-batched-bench (32 sequences of 128 prompt tokens, 128 generated each: W's shape) against rtp_llm's W as
    stored and dequantized: output tok/s over the whole run (prompts included), and the generation phase alone
    (llama.cpp's S_TG; rtp_llm's 32 x 127 tokens after the first over the time after it).
B8: the same with 8 sequences.
B1L: B1 after a 1920-token prompt: llama-bench tg128 at depth 1920 (llama.cpp's KV cache is f16 by default, half
    the bytes of rtp_llm's float32 cache for a float32 model).

    python -m benchmarks.gguf_decode [--workload B1|B1L|B8|W] [--model FILE.gguf] [--rounds 5]

--model defaults to the embedded SmolLM2 Q4_1 file; bash benchmarks/peers/setup_qwen_coder.sh installs
Qwen2.5-Coder-0.5B-Instruct Q4_K_M and prints its path.
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
_BIN = os.path.join(_ROOT, ".venv-llamacpp", "build", "bin")


def llama_b1(binary: str, gguf: str, new_tokens: int, depth: int = 0) -> dict:
    """llama-bench's tg: new_tokens generated one at a time after `depth` tokens already in the context. With a
    depth, both of llama.cpp's attention paths (flash attention on and off) and the faster one's time."""
    cmd = [binary, "-m", gguf, "-t", "2", "-p", "0", "-n", str(new_tokens), "-r", "1", "-o", "json"]
    if depth:
        cmd += ["-d", str(depth), "-fa", "on,off"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=peer_environ())
    if run.returncode < 0:  # as in llama_w: the repacked weights crash llama-bench at a depth on the AMX Xeon VM
        print(f"llama-bench died ({run.returncode}); rerun with --repack 0", flush=True)
        run = subprocess.run(cmd + ["--repack", "0"], capture_output=True, text=True, env=peer_environ())
    if run.returncode != 0:
        raise subprocess.CalledProcessError(run.returncode, cmd, run.stdout, run.stderr)
    return {"tpot_ms": 1000.0 / max(row["avg_ts"] for row in json.loads(run.stdout))}


def llama_w(binary: str, gguf: str, w) -> dict:
    ctx = w.num_prompts * (w.prompt_len + w.new_tokens)
    cmd = [binary, "-m", gguf, "-t", "2", "-c", str(ctx), "-npp", str(w.prompt_len), "-ntg", str(w.new_tokens),
           "-npl", str(w.num_prompts), "--output-format", "jsonl"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=peer_environ())
    if run.returncode < 0:
        # llama.cpp's repacked CPU weights crash llama-batched-bench on some CPUs (SIGSEGV on an AMX Xeon VM,
        # 2026-12): the same run on the file's own layout, said so in the output
        print(f"llama-batched-bench died ({run.returncode}); rerun with --no-repack", flush=True)
        run = subprocess.run(cmd + ["--no-repack"], capture_output=True, text=True, env=peer_environ())
    if run.returncode != 0:
        raise subprocess.CalledProcessError(run.returncode, cmd, run.stdout, run.stderr)
    out = run.stdout
    row = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return {"tok_s": w.num_prompts * w.new_tokens / row["t"], "gen_tok_s": row["speed_tg"]}


def rtp(engine, prompts, w) -> dict:
    _, total, extra = engine.run(prompts, w.new_tokens)
    gen = total - extra["ttft_s"]
    return {"tok_s": len(prompts) * w.new_tokens / total, "gen_tok_s": len(prompts) * (w.new_tokens - 1) / gen,
            "tpot_ms": gen / (w.new_tokens - 1) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=["B1", "B1L", "B8", "W"], default="B1")
    ap.add_argument("--model", default=None, help="a GGUF file (default: the embedded SmolLM2 Q4_1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--llama-bin", default=_BIN, help="the folder with llama-bench and llama-batched-bench")
    args = ap.parse_args()
    one = args.workload in ("B1", "B1L")  # one sequence: time per output token against llama-bench's tg
    tool = os.path.join(args.llama_bin, "llama-bench" if one else "llama-batched-bench")
    if not os.path.exists(tool):
        raise SystemExit(f"{tool} missing: bash benchmarks/peers/setup_llamacpp.sh")
    gguf, w = args.model or default_model_path(), WORKLOADS[args.workload]
    prompts = w.prompts()
    engines = {"rtp_llm": RtpLLM(model=gguf), "rtp_llm_dequantized": RtpLLMDequantized(model=gguf)}
    for e in engines.values():
        e.run(prompts[:4], 8)  # warm-up
    key = "tpot_ms" if one else "tok_s"
    peer = ("llama.cpp tg128" + (f" @ depth {w.prompt_len}" if args.workload == "B1L" else "")) if one \
        else "llama-batched-bench"
    res: dict[str, list[dict]] = {k: [] for k in [peer] + list(engines)}
    for r in range(args.rounds):
        res[peer].append(llama_b1(tool, gguf, w.new_tokens, w.prompt_len if args.workload == "B1L" else 0) if one
                         else llama_w(tool, gguf, w))
        for name, e in engines.items():
            res[name].append(rtp(e, prompts, w))
        print(f"round {r}:", {k: {m: round(x, 2) for m, x in v[-1].items()} for k, v in res.items()}, flush=True)
    print(f"{os.path.basename(gguf)}, {args.workload}, {args.rounds} rounds")
    for k, v in res.items():
        for m in v[0]:
            xs = [x[m] for x in v]
            print(f"{k} {m}: min / median / max {min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}")
    for name in engines:
        for m in ([key] if one else ["tok_s", "gen_tok_s"]):
            ratios = [a[m] / b[m] for a, b in zip(res[name], res[peer])]
            print(f"{name} / {peer} {m}, same round:", " / ".join(f"{x:.2f}" for x in ratios))
    if not one:
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(res["rtp_llm"], res["rtp_llm_dequantized"])]
        print("rtp_llm as stored / dequantized tok_s, same round:", " / ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
