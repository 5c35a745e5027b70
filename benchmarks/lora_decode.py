"""LoRA serving cost: B1 TPOT and W throughput with adapters against the same engine without them, on the embedded
SmolLM2-135M (its float32 Hugging Face export) with random rank-16 adapters on all seven target modules (made with
peft), alternating rounds in one run.

    python -m benchmarks.lora_decode [--rounds 3] [--rank 16] [--adapters 4] [--requests 32]

B1: one request, 128 new tokens, TPOT from its first to its last token. W: `--requests` requests of 64 prompt and
64 new tokens at once, spread over `--adapters` adapters round-robin, against the same requests on the base model.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32)
    args = ap.parse_args()

    from benchmarks.peers.export_hf import export
    from rtp_llm import LLM, SamplingParams
    from rtp_llm.lora import LoRARequest

    model = export()
    loras = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(make_adapters(model, args.adapters, args.rank))]
    llm = LLM(model, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank, max_model_len=1024,
              max_num_seqs=args.requests)
    rng = random.Random(0)
    b1_prompt = [rng.randrange(100, 49000) for _ in range(32)]
    w_prompts = [[rng.randrange(100, 49000) for _ in range(64)] for _ in range(args.requests)]
    b1 = SamplingParams(max_tokens=128, min_tokens=128, temperature=0, ignore_eos=True)
    w = SamplingParams(max_tokens=64, min_tokens=64, temperature=0, ignore_eos=True)

    def tpot(lora):
        out = llm.generate([b1_prompt], b1, use_tqdm=False, lora_request=lora)[0]
        m = out.metrics
        return (m["finish"] - m["first_token"]) / (out.outputs[0].num_tokens - 1)

    def throughput(with_loras: bool):
        import time

        reqs = [loras[i % len(loras)] for i in range(args.requests)] if with_loras else None
        t0 = time.perf_counter()
        outs = llm.generate(w_prompts, w, use_tqdm=False, lora_request=reqs)
        return sum(o.outputs[0].num_tokens for o in outs) / (time.perf_counter() - t0)

    tpot(loras[0]), tpot(None), throughput(True), throughput(False)  # warm-up, every adapter resident
    runs = {"b1_base": [], "b1_lora": [], "w_base": [], "w_lora": []}
    for r in range(args.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        for lora in order:
            runs["b1_lora" if lora else "b1_base"].append(tpot(loras[0] if lora else None) * 1000)
        for lora in order:
            runs["w_lora" if lora else "w_base"].append(throughput(lora))
    for name, values in runs.items():
        v = sorted(values)
        unit = "ms" if name.startswith("b1") else "tok/s"
        print(f"{name:8s} min {v[0]:8.2f} median {statistics.median(v):8.2f} max {v[-1]:8.2f} {unit}")
    print(f"B1 TPOT with an adapter / without: {statistics.median(runs['b1_lora']) / statistics.median(runs['b1_base']):.3f}x")
    print(f"W over {args.adapters} adapters / without: "
          f"{statistics.median(runs['w_lora']) / statistics.median(runs['w_base']):.3f}x")
    llm.close()


if __name__ == "__main__":
    main()
