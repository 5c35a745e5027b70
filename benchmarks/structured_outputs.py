"""Structured outputs: what a grammar costs, on the embedded model's tokenizer (SmolLM2, 49,152 tokens).

    python -m benchmarks.structured_outputs [--rounds 3] [--batch 32] [--tokens 64] [--skip-engine]

1. compile: a typical schema (nested object, array of enums, pattern, bounds) made into a ready matcher, uncached,
   with llguidance (the engine's) and, when importable, xgrammar (`pip install --no-deps xgrammar==0.2.9
   apache-tvm-ffi`, a peer only, not a dependency); plus each library's one-time tokenizer set-up.
2. masks: per decode step at `--batch` rows, the token masks of every constrained row (teacher-forced through a
   valid document, as a batch of answers would advance) and their application to [batch, vocab] logits, against
   the step's sampler without them.
3. engine: `--batch` requests of `--tokens` tokens on the embedded model, constrained by the schema vs free
   (ignore_eos, same lengths), rounds alternating: decode time per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Chinese"]}, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False},
    "email": {"type": "string", "maxLength": 30}},
    "required": ["name", "age", "languages", "address"], "additionalProperties": False}
DOC = {"name": "Ada Lovelace", "age": 36, "languages": ["English", "French"],
       "address": {"city": "London", "zip": "10115"}, "email": "ada@example.org"}


def _stats(xs):
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3), "max": round(max(xs), 3)}


def bench_compile(tok, rounds):
    import llguidance as llg

    from rtp_llm.sampling.grammar import GrammarCompiler
    from rtp_llm.sampling.structured_outputs import StructuredOutputs

    t0 = time.perf_counter()
    gc = GrammarCompiler(tok, 49152, [tok.eos_token_id])
    lt = gc.lltokenizer
    setup = time.perf_counter() - t0
    times = []
    for i in range(rounds * 5):
        schema = dict(SCHEMA, title=f"s{i}")  # a new key each time: no cache hit
        t0 = time.perf_counter()
        gc.matcher(StructuredOutputs(json=schema))
        times.append((time.perf_counter() - t0) * 1e3)
    out = {"llguidance": {"version": llg.__version__, "tokenizer_setup_s": round(setup, 3),
                          "compile_ms": _stats(times)}}
    del lt
    try:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        out["xgrammar"] = "not installed"
        return out, gc
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tok.backend,
                                                                      eos_token=tok.eos_token), vocab_size=49152)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    setup = time.perf_counter() - t0
    times = []
    for i in range(rounds * 5):
        t0 = time.perf_counter()
        xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(dict(SCHEMA, title=f"s{i}"))))
        times.append((time.perf_counter() - t0) * 1e3)
    from importlib.metadata import version

    out["xgrammar"] = {"version": version("xgrammar"), "tokenizer_setup_s": round(setup, 3), "compile_ms": _stats(times)}
    return out, gc


def bench_masks(tok, gc, batch, rounds):
    from rtp_llm.sampling import Sampler, SamplingBatch, SamplingParams
    from rtp_llm.sampling.structured_outputs import StructuredOutputs

    doc = tok.encode(json.dumps(DOC), add_special_tokens=False)
    vocab = 49152
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.8, seed=i) for i in range(batch)]
    sampler = Sampler()
    mask_ms, apply_ms, base_ms = [], [], []
    for _ in range(rounds):
        grammars = [gc.matcher(StructuredOutputs(json=SCHEMA)) for _ in range(batch)]
        for step, token in enumerate(doc):
            b = SamplingBatch.build(params, list(range(batch)), [step] * batch, [[]] * batch, [[]] * batch, vocab)
            t0 = time.perf_counter()
            sampler(logits, b)
            t1 = time.perf_counter()
            allowed = gc.masks(grammars, vocab)
            t2 = time.perf_counter()
            b.grammar = (torch.arange(batch), allowed)
            Sampler.shape_logits(logits, b)
            t3 = time.perf_counter()
            base_ms.append((t1 - t0) * 1e3)
            mask_ms.append((t2 - t1) * 1e3)
            apply_ms.append((t3 - t2) * 1e3)
            assert bool(allowed[:, token].all()), "the document must stay allowed"
            for g in grammars:
                assert g.accept(token, []) is None
    out = {"batch": batch, "steps": len(doc), "sampler_ms": _stats(base_ms),
           "llguidance_masks_ms": _stats(mask_ms), "apply_ms": _stats(apply_ms)}
    try:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return out
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tok.backend,
                                                                      eos_token=tok.eos_token), vocab_size=vocab)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    xg_ms = []
    for _ in range(rounds):
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        bitmask = xgr.allocate_token_bitmask(batch, vocab)
        for token in doc:
            t0 = time.perf_counter()
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, i)
            xg_ms.append((time.perf_counter() - t0) * 1e3)
            for m in matchers:
                assert m.accept_token(token)
    out["xgrammar_masks_ms"] = _stats(xg_ms)
    return out


def bench_engine(batch, tokens, rounds):
    """Free requests get the constrained answers' lengths, so both runs step the same batch shapes."""
    from rtp_llm import LLM, SamplingParams

    llm = LLM(max_model_len=1024, max_num_seqs=batch)
    ids = [llm.processor.chat_prompt([{"role": "user", "content": f"Person number {i} as JSON."}])
           for i in range(batch)]
    constrained = SamplingParams(max_tokens=tokens, temperature=0.8, seed=1, structured_outputs={"json": SCHEMA})
    lengths = [len(o.outputs[0].token_ids) for o in llm.generate(ids, constrained, use_tqdm=False)]
    free = [SamplingParams(max_tokens=n, temperature=0.8, seed=1, ignore_eos=True) for n in lengths]
    res = {"constrained": [], "free": []}
    for _ in range(rounds):
        for kind, params in (("constrained", constrained), ("free", free)):
            t0 = time.perf_counter()
            outs = llm.generate(ids, params, use_tqdm=False)
            res[kind].append((time.perf_counter() - t0) / max(lengths) * 1e3)
            assert [len(o.outputs[0].token_ids) for o in outs] == lengths
    llm.close()
    c, f = statistics.median(res["constrained"]), statistics.median(res["free"])
    return {"batch": batch, "ms_per_step_constrained": _stats(res["constrained"]),
            "ms_per_step_free": _stats(res["free"]), "constrained_over_free": round(c / f, 3),
            "answer_tokens": _stats(lengths)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--skip-engine", action="store_true")
    args = ap.parse_args()
    from rtp_llm.models.default_model import default_model_path
    from rtp_llm.tokenizer import Tokenizer

    tok = Tokenizer.load(default_model_path())
    compiled, gc = bench_compile(tok, args.rounds)
    print(json.dumps({"compile": compiled}), flush=True)
    print(json.dumps({"masks": bench_masks(tok, gc, args.batch, args.rounds)}), flush=True)
    if not args.skip_engine:
        print(json.dumps({"engine": bench_engine(args.batch, args.tokens, args.rounds)}), flush=True)


if __name__ == "__main__":
    main()
