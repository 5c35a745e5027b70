"""vLLM's CPU build as the embedding peer (its pooling runner: runner="pooling", convert="embed"). Runs in its own
venv, never imports rtp_llm: one JSON job per input line ({"prompts": [[token ids]]}), one RESULT_MARK line per
job with the seconds and the embeddings.

    .venv-vllm/bin/python benchmarks/peers/vllm_embed_peer.py MODEL_DIR [--dtype float32]
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
    ap.add_argument("--max_num_seqs", type=int, default=128)
    ap.add_argument("--max_num_batched_tokens", type=int, default=4096)
    args = ap.parse_args()

    from vllm import LLM
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, dtype=args.dtype, runner="pooling", convert="embed", max_model_len=2048,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=False, seed=0)
    print(RESULT_MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
        t0 = time.perf_counter()
        outs = llm.embed(prompts, use_tqdm=False)
        seconds = time.perf_counter() - t0
        print(RESULT_MARK + json.dumps({"seconds": seconds, "embeddings": [list(o.outputs.embedding[:64])
                                                                           for o in outs[:4]]}), flush=True)


if __name__ == "__main__":
    main()
