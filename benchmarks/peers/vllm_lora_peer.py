"""vLLM's CPU build with LoRA adapters, as benchmarks/lora_decode.py's peer. Runs in its own venv, never imports
rtp_llm: one JSON job per input line ({"prompts": [[ids]], "new_tokens": N, "adapters": [index or null]}), one
RESULT_MARK line per job with the seconds, the tokens and the B1 TPOT of the first request.

    .venv-vllm/bin/python benchmarks/peers/vllm_lora_peer.py MODEL_DIR ADAPTER_DIR... [--rank 16]
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
    ap.add_argument("adapters", nargs="+")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--max_num_seqs", type=int, default=64)
    args = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    llm = LLM(model=args.model, dtype="float32", max_model_len=1024, max_num_seqs=args.max_num_seqs,
              enable_prefix_caching=False, seed=0, enable_lora=True, max_loras=len(args.adapters),
              max_lora_rank=args.rank)
    loras = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(args.adapters)]
    print(RESULT_MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        n = job["new_tokens"]
        params = SamplingParams(max_tokens=n, min_tokens=n, temperature=0, ignore_eos=True)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
        reqs = [None if a is None else loras[a] for a in job["adapters"]]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False, lora_request=reqs)
        seconds = time.perf_counter() - t0
        m = getattr(outs[0], "metrics", None)
        first = getattr(m, "first_token_latency", None) if m is not None else None
        tpot = None if first is None else (seconds - first) / (n - 1)
        print(RESULT_MARK + json.dumps({"seconds": seconds, "tpot_s": tpot,
                                        "tokens": [list(o.outputs[0].token_ids) for o in outs]}), flush=True)


if __name__ == "__main__":
    main()
