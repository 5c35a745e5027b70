"""Another checkout of rtp-llm as a benchmark peer (a commit before a change, say), in a process of its own so
that both run the same workload in one harness run, rounds alternating. It speaks the peers' pipe protocol: one
JSON job per input line ({"prompts": [[token ids]], "new_tokens": N}), one RESULT_MARK-prefixed result line per
job. Only the offline API (LLM.generate) is used, which every version has.

    PYTHONPATH=/path/to/checkout python benchmarks/peers/rtp_llm_peer.py [--dtype float32] [--quantization auto]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from protocol import RESULT_MARK  # benchmarks/peers/protocol.py (this script's folder is on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quantization", default="auto", help="none: a GGUF dequantized at load (checkouts since issue 21)")
    args = ap.parse_args()

    import rtp_llm
    from rtp_llm import LLM, SamplingParams

    # The limits of benchmarks.engines.RtpLLM; prefix caching off because rounds repeat their prompts.
    extra = {} if args.quantization == "auto" else {"quantization": args.quantization}
    llm = LLM(dtype=args.dtype, **extra, max_model_len=2048, max_num_seqs=64, max_num_batched_tokens=4096,
              kv_cache_memory_gb=1.0, enable_prefix_caching=False)
    print(RESULT_MARK + json.dumps({"ready": True, "rtp_llm": rtp_llm.__file__}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        params = SamplingParams(max_tokens=job["new_tokens"], temperature=0, ignore_eos=True)
        t0, start = time.perf_counter(), time.monotonic()
        outs = llm.generate(job["prompts"], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        print(RESULT_MARK + json.dumps({"tokens": [o.outputs[0].token_ids for o in outs], "seconds": seconds,
                                        "ttft_s": min(o.metrics["first_token"] for o in outs) - start}), flush=True)


if __name__ == "__main__":
    main()
