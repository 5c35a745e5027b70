"""llama.cpp as a benchmark peer, through llama-cpp-python's C API bindings (the high-level Llama class
decodes one sequence at a time; batched decoding needs llama_batch with one sequence id per prompt, as
llama.cpp's own llama-batched-bench does). Runs inside its own venv (benchmarks/peers/setup_llamacpp.sh),
never imports rtp_llm, and speaks the vLLM peer's pipe protocol: one JSON job per input line
({"prompts": [[token ids]], "new_tokens": N}), one RESULT_MARK-prefixed result line per job.

Greedy = argmax of each sequence's logits, the same rule the other engines use. llama.cpp's defaults are
kept otherwise (f16 KV cache, flash attention on auto), as a user would run it.

    LLAMA_CPP_LIB_PATH=.venv-llamacpp/build/bin .venv-llamacpp/bin/python benchmarks/peers/llamacpp_peer.py \
        .venv-llamacpp/model-f32.gguf [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from protocol import RESULT_MARK  # benchmarks/peers/protocol.py (this script's folder is on sys.path)


class Runner:
    def __init__(self, model_path: str, threads: int, max_seqs: int, max_tokens_per_seq: int):
        import llama_cpp as L

        self.L = L
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(model_path.encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = max_seqs * max_tokens_per_seq
        cp.n_batch = max_seqs * max_tokens_per_seq  # a whole W prefill in one llama_decode call
        cp.n_seq_max = max_seqs
        cp.n_threads = cp.n_threads_batch = threads
        cp.kv_unified = True  # one KV buffer shared by the sequences (llama-batched-bench -kvu)
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp could not create a context")
        self.capacity = cp.n_batch
        self.batch = L.llama_batch_init(self.capacity, 0, 1)

    def _decode(self, entries) -> None:
        """entries: (token, position, sequence, wants logits)."""
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if logits else 0
        b.n_tokens = len(entries)
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")

    def _argmax(self, i: int) -> int:
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def generate(self, prompts, new_tokens):
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
        entries, last = [], []
        for s, p in enumerate(prompts):
            entries += [(t, j, s, j == len(p) - 1) for j, t in enumerate(p)]
            last.append(len(entries) - 1)
        t0 = time.perf_counter()
        self._decode(entries)
        out = [[self._argmax(i)] for i in last]
        ttft = time.perf_counter() - t0
        lens = [len(p) for p in prompts]
        for step in range(1, new_tokens):
            self._decode([(o[-1], lens[s] + step - 1, s, True) for s, o in enumerate(out)])
            for s, o in enumerate(out):
                o.append(self._argmax(s))
        return out, time.perf_counter() - t0, ttft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--max_seqs", type=int, default=64)
    ap.add_argument("--max_tokens_per_seq", type=int, default=320)
    args = ap.parse_args()
    runner = Runner(args.model, args.threads, args.max_seqs, args.max_tokens_per_seq)
    print(RESULT_MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        tokens, seconds, ttft = runner.generate(job["prompts"], job["new_tokens"])
        print(RESULT_MARK + json.dumps({"tokens": tokens, "seconds": seconds, "ttft_s": ttft}), flush=True)


if __name__ == "__main__":
    main()
