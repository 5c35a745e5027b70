"""vLLM's CPU build as a benchmark peer. Runs inside its own venv (benchmarks/peers/setup_vllm.sh), never
imports rtp_llm, and talks to the harness over stdin/stdout: one JSON job per input line
({"prompts": [[token ids]], "new_tokens": N}, with --adapters also "adapters": [index into them, or null per
prompt]), one result line per job, prefixed with RESULT_MARK because vLLM logs to stdout too.

    .venv-vllm/bin/python benchmarks/peers/vllm_peer.py MODEL_DIR [--dtype float32] [--skip_tokenizer]
        [--adapters DIR... --max_lora_rank R]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from protocol import RESULT_MARK  # benchmarks/peers/protocol.py (this script's folder is on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max_num_seqs", type=int, default=64)
    ap.add_argument("--max_num_batched_tokens", type=int, default=4096)
    ap.add_argument("--adapters", nargs="*", default=[], help="LoRA adapter directories (benchmarks/lora_decode.py)")
    ap.add_argument("--max_lora_rank", type=int, default=16)
    ap.add_argument("--skip_tokenizer", action="store_true", help="a model directory without a tokenizer")
    args = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    lora = dict(enable_lora=True, max_loras=len(args.adapters), max_lora_rank=args.max_lora_rank) if args.adapters \
        else {}
    # The same limits as rtp_llm's benchmark engine; prefix caching off because rounds repeat prompts.
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=2048, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=False, seed=0,
              skip_tokenizer_init=args.skip_tokenizer, **lora)
    adapters = []
    if args.adapters:
        from vllm.lora.request import LoRARequest

        adapters = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(args.adapters)]
    print(RESULT_MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        params = SamplingParams(max_tokens=job["new_tokens"], min_tokens=job["new_tokens"], temperature=0,
                                ignore_eos=True, detokenize=not args.skip_tokenizer)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
        t0 = time.perf_counter()
        loras = [None if a is None else adapters[a] for a in job["adapters"]] if "adapters" in job else None
        outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
        seconds = time.perf_counter() - t0
        ttft = [o.metrics.first_token_latency for o in outs if getattr(o, "metrics", None) is not None
                and getattr(o.metrics, "first_token_latency", None) is not None]
        print(RESULT_MARK + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outs], "seconds": seconds,
                                        "ttft_s": min(ttft) if ttft else None}), flush=True)


if __name__ == "__main__":
    main()
