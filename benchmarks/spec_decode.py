"""Speculative decoding against plain decoding of the same model, batch 1, in alternating rounds.

    python -m benchmarks.spec_decode [--model PATH] [--dtype float32] [--rounds 3] [--k 4] [--lookup 2,4]
                                     [--quantization auto] [--draft PATH [--draft-dtype bfloat16]
                                     [--draft-quantization auto]] [--batch-w]
                                     [--llamacpp .venv-llamacpp/build/bin [--llamacpp-model F] [--llamacpp-draft F]]

Configurations: plain, ngram (--lookup lo,hi), lookup (method "lookup", n-grams of hi down to 1), draft (--draft).
Workloads (chat prompts through the model's template, greedy, up to --max-tokens, natural EOS): input-grounded
work where the answer repeats the input (rename in a source file, reformat a JSON document given compact or in
json.dumps's spaced one-line form, quote a passage with small edits) and open chat. Outputs are the same bits
with and without speculation (checked every round), so each configuration does the same work. Reported per
workload and configuration: TPOT (time per output token after the first) min / median / max over rounds, the
same-round ratio to plain decoding, the acceptance (accepted / drafted tokens) and how much of the output is
copied from the prompt (characters in common runs of 20+).
--llamacpp: llama.cpp's own speculation on the same prompts (rtp-llm's chat template applied, greedy), in the
same rounds: llama-lookup (n-gram lookup decoding, --spec-draft-n-max k; with 0 its plain decoding) and, with
--llamacpp-draft, llama-speculative (draft-model speculation). TPOT is 1 / the "decoded ... speed" they print
(generation only). The model file defaults to --model.
--batch-w: also W's shape (32 requests of 128 random tokens, 128 new) with speculation on vs off.
--step-rows 1,2,3,5,8: one sequence's step of r new rows after a cached 704-token prefix (what verifying r - 1 drafts
costs), median time over --rounds: the cost curve the speculator learns online.
--batch-rule 1,2,4,8,16: throughput of that many concurrent requests (the workloads in turn, 96 tokens each, EOS
ignored) with every step speculating (disable_by_batch_size off) vs plain: where the engine's default rule comes from.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import statistics
import time

# rtp_llm before torch (OpenMP wait policy)
from rtp_llm import LLM, SamplingParams

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _source_file() -> str:
    with open(os.path.join(ROOT, "rtp_llm", "engine", "output_processor.py")) as f:
        return f.read()


def _json_doc(compact: bool = True) -> str:
    """compact: no spaces after separators (every key and value token differs from the indented answer's); else
    json.dumps's default one-line form, whose "key": value pieces the indented answer repeats."""
    rows = [{"id": i, "name": f"item-{i}", "price": round(3.5 + i * 1.25, 2), "tags": ["a", "b"][: 1 + i % 2],
             "in_stock": i % 3 != 0} for i in range(24)]
    return json.dumps(rows, separators=(",", ":")) if compact else json.dumps(rows)


PASSAGE = ("The engine runs the same models on CPU, CUDA GPUs and Ascend NPUs. Its users are teams moving "
           "inference from CUDA to Ascend who want one engine whose output is identical on every device, that builds "
           "offline in one command, and that serves an OpenAI-compatible API. A request's output never depends on "
           "what else is in the batch, how its prefill was chunked, or whether its prefix came from the cache. ") * 3

WORKLOADS = {
    "rename": lambda: "Rename the class OutputProcessor to OutputStage everywhere in this file and return the whole "
                      "file, nothing else:\n\n" + _source_file(),
    "json": lambda: "Reformat this JSON with an indent of 2 spaces, one key per line. Return only the JSON:\n\n"
                    + _json_doc(),
    "json_spaced": lambda: "Reformat this JSON with an indent of 2 spaces, one key per line. Return only the JSON:\n\n"
                           + _json_doc(compact=False),
    "quote": lambda: "Quote the following passage exactly, but write 'runtime' instead of 'engine':\n\n" + PASSAGE,
    "chat": lambda: "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def copied_share(prompt: str, output: str, min_run: int = 20) -> float:
    """Share of the output's characters in runs of at least min_run characters that also occur in the prompt."""
    if not output:
        return 0.0
    m = difflib.SequenceMatcher(None, output, prompt, autojunk=False)
    return sum(b.size for b in m.get_matching_blocks() if b.size >= min_run) / len(output)


def _one(llm: LLM, prompt: str, max_tokens: int):
    core = llm.core
    s0 = core.stats()
    out = llm.chat([{"role": "user", "content": prompt}], SamplingParams(max_tokens=max_tokens, temperature=0),
                   use_tqdm=False)[0]
    s1 = core.stats()
    o = out.outputs[0]
    n = len(o.token_ids)
    tpot = (out.metrics["finish"] - out.metrics["first_token"]) / max(n - 1, 1)
    drafted = s1.get("spec_decode_num_draft_tokens", 0) - s0.get("spec_decode_num_draft_tokens", 0)
    accepted = s1.get("spec_decode_num_accepted_tokens", 0) - s0.get("spec_decode_num_accepted_tokens", 0)
    return o.token_ids, o.text, tpot, drafted, accepted


def _llamacpp(bin_dir: str, tool: str, model: str, prompt: str, max_tokens: int, k: int, draft=None):
    """(TPOT s, drafted, accepted) of one llama.cpp run, greedy, 2 threads."""
    import re
    import subprocess

    cmd = [os.path.join(bin_dir, tool), "-m", model, "-p", prompt, "-n", str(max_tokens), "-t", str(os.cpu_count()),
           "-c", "4096", "--temp", "0", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"]
    if draft:
        cmd += ["-md", draft]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    log = run.stdout + run.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    if run.returncode != 0 or m is None:
        raise SystemExit(f"{tool} failed ({run.returncode}):\n{log[-2000:]}")
    grab = lambda name: int(re.search(name + r"\s*=\s*(\d+)", log).group(1))  # noqa: E731
    return float(m.group(2)) / max(int(m.group(1)), 1), grab("n_drafted"), grab("n_accept")


def _w(llm: LLM) -> float:
    from benchmarks.workloads import WORKLOADS as W

    wl = W["W"]
    t = time.perf_counter()
    outs = llm.generate(wl.prompts(), SamplingParams(max_tokens=wl.new_tokens, temperature=0, ignore_eos=True),
                        use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t)


def _step_rows(args, row_counts) -> None:
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=2048, enable_prefix_caching=True, block_size=16)
    prefix = list(range(1000, 1704))
    greedy1 = SamplingParams(max_tokens=1, temperature=0)
    llm.generate([prefix], greedy1, use_tqdm=False)
    times = {r: [] for r in row_counts}
    for i in range(args.rounds):
        for r in row_counts:
            out = llm.generate([prefix + list(range(5000 + 10 * i, 5000 + 10 * i + r))], greedy1, use_tqdm=False)[0]
            assert out.num_cached_tokens == len(prefix)
            times[r].append((out.metrics["first_token"] - out.metrics["arrival"]) * 1e3)
    base = statistics.median(times[row_counts[0]])
    print(f"| rows | ms min / median / max | vs {row_counts[0]} row(s) |")
    print("| --- | --- | --- |")
    for r, ts in times.items():
        ts = sorted(ts)
        med = statistics.median(ts)
        print(f"| {r} | {ts[0]:.1f} / {med:.1f} / {ts[-1]:.1f} | {med / base:.2f} |")
    llm.close()


def _batch_rule(args, concurrencies) -> None:
    lo, hi = (int(x) for x in args.lookup.split(","))
    common = dict(model=args.model, dtype=args.dtype, max_model_len=4096, enable_prefix_caching=False,
                  kv_cache_memory_gb=2)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": lo, "prompt_lookup_max": hi,
            "disable_by_batch_size": 1 << 20}
    llms = {"plain": LLM(**common), "always": LLM(speculative_config=spec, **common)}
    prompts = [WORKLOADS[w]() for w in ("rename", "json", "quote", "chat")]  # the rule as measured
    print("| concurrent requests | plain tok/s min / median / max | speculating every step | ratio (median) |")
    print("| --- | --- | --- | --- |")
    for c in concurrencies:
        convs = [[{"role": "user", "content": prompts[i % len(prompts)]}] for i in range(c)]
        rates = {k: [] for k in llms}
        for _ in range(args.rounds):
            for k, llm in llms.items():
                t = time.perf_counter()
                outs = llm.chat(convs, SamplingParams(max_tokens=96, temperature=0, ignore_eos=True), use_tqdm=False)
                rates[k].append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t))
        p, a = sorted(rates["plain"]), sorted(rates["always"])
        print(f"| {c} | {p[0]:.1f} / {statistics.median(p):.1f} / {p[-1]:.1f} | {a[0]:.1f} / {statistics.median(a):.1f}"
              f" / {a[-1]:.1f} | {statistics.median(a) / statistics.median(p):.3f} |", flush=True)
    for llm in llms.values():
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup", default="2,4", help="ngram prompt_lookup_min,max")
    ap.add_argument("--draft", help="also a draft model (its checkpoint) drafting for --model")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--batch-w", action="store_true")
    ap.add_argument("--batch-rule", help="comma-separated concurrencies")
    ap.add_argument("--step-rows", help="comma-separated row counts")
    ap.add_argument("--draft-dtype", help="the draft model's dtype (default: --dtype)")
    ap.add_argument("--quantization", default="auto", help="the target's --quantization (none: a GGUF dequantized)")
    ap.add_argument("--draft-quantization", help="the draft's (default: the target's)")
    ap.add_argument("--llamacpp", help="llama.cpp's bin directory (benchmarks/peers/setup_llamacpp.sh builds it)")
    ap.add_argument("--llamacpp-model", help="the GGUF llama.cpp runs (default: --model)")
    ap.add_argument("--llamacpp-draft", help="the draft GGUF for llama-speculative")
    args = ap.parse_args()
    if args.batch_rule:
        return _batch_rule(args, [int(c) for c in args.batch_rule.split(",")])
    if args.step_rows:
        return _step_rows(args, [int(r) for r in args.step_rows.split(",")])

    lo, hi = (int(x) for x in args.lookup.split(","))
    configs = {"plain": None,
               "ngram": {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": lo,
                         "prompt_lookup_max": hi},
               "lookup": {"method": "lookup", "num_speculative_tokens": args.k, "prompt_lookup_max": hi}}
    if args.draft:
        configs["draft"] = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k}
        if args.draft_dtype:
            configs["draft"]["dtype"] = args.draft_dtype
        if args.draft_quantization:
            configs["draft"]["quantization"] = args.draft_quantization
    common = dict(model=args.model, dtype=args.dtype, quantization=args.quantization, max_model_len=4096,
                  enable_prefix_caching=False, kv_cache_memory_gb=0.5)
    llms = {name: LLM(speculative_config=cfg, **common) for name, cfg in configs.items()}
    names = [w for w in args.workloads.split(",") if w]
    prompts = {w: WORKLOADS[w]() for w in names}
    for llm in llms.values():  # warm-up
        _one(llm, prompts[names[0]], 16)
    peers = []
    if args.llamacpp:
        peers = [("llama.cpp plain", "llama-lookup", 0, None), ("llama.cpp lookup", "llama-lookup", args.k, None)]
        if args.llamacpp_draft:
            peers.append(("llama.cpp draft", "llama-speculative", args.k, args.llamacpp_draft))
    peer_model = args.llamacpp_model or args.model
    columns = list(configs) + [p[0] for p in peers]
    tpot = {(w, c): [] for w in names for c in columns}
    acc = {(w, c): [0, 0] for w in names for c in columns}
    ratio = {(w, c): [] for w in names for c in columns}
    info = {}
    for r in range(args.rounds):
        for w in names:
            ref = None
            for c, llm in llms.items():
                ids, text, t, drafted, accepted = _one(llm, prompts[w], args.max_tokens)
                if ref is None:
                    ref = (ids, t)
                    info[w] = (len(ids), copied_share(prompts[w], text), len(llm.tokenizer.encode(prompts[w])))
                elif ids != ref[0]:
                    raise SystemExit(f"{w}: {c} produced other tokens than plain decoding")
                tpot[w, c].append(t)
                ratio[w, c].append(t / ref[1])
                acc[w, c][0] += drafted
                acc[w, c][1] += accepted
            for c, tool, k, draft in peers:
                text = llms["plain"].processor.render_chat([{"role": "user", "content": prompts[w]}], True)
                t, drafted, accepted = _llamacpp(args.llamacpp, tool, peer_model, text, args.max_tokens, k, draft)
                tpot[w, c].append(t)
                ratio[w, c].append(t / ref[1])
                acc[w, c][0] += drafted
                acc[w, c][1] += accepted
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(f"\nmodel {args.model or 'default (SmolLM2-135M-Instruct)'}, {args.dtype}, k={args.k}, ngram lookup "
          f"{lo}..{hi}, {args.rounds} rounds, batch 1")
    print("| workload | prompt / output tokens | copied | config | TPOT ms min / median / max | vs plain (same round, "
          "median) | accepted / drafted |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for w in names:
        n_out, share, n_in = info[w]
        for c in columns:
            ts = sorted(x * 1e3 for x in tpot[w, c])
            d, a = acc[w, c]
            print(f"| {w} | {n_in} / {n_out} | {share:.0%} | {c} | {ts[0]:.2f} / {statistics.median(ts):.2f} / "
                  f"{ts[-1]:.2f} | {statistics.median(ratio[w, c]):.3f} | "
                  f"{f'{a}/{d} ({a / d:.0%})' if d else '-'} |")
    if args.batch_w:
        rates = {c: [] for c in configs}
        for _ in range(args.rounds):
            for c, llm in llms.items():
                rates[c].append(_w(llm))
        for c, xs in rates.items():
            xs = sorted(xs)
            print(f"W {c}: {xs[0]:.1f} / {statistics.median(xs):.1f} / {xs[-1]:.1f} tok/s; vs plain (median) "
                  f"{statistics.median(xs) / statistics.median(rates['plain']):.3f}")
    for llm in llms.values():
        llm.close()


if __name__ == "__main__":
    main()
