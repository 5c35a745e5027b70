"""Layer-by-layer comparison of one model on two sides (devices, dtypes, quantization as stored vs dequantized, or
transformers as a reference): the migration write-ups' "keep every layer's float32 CPU output as the baseline, then
compare on the NPU step by step", as one command.

    python -m rtp_llm.tools.compare --model M [--prompt TEXT | --token_ids 1,2,3] [--steps K]
        --baseline cpu:float32 --candidate npu:bfloat16 [--tp N] [--json F] [--plot F.png] [--dump DIR]

A side is DEVICE:DTYPE[:QUANTIZATION] (QUANTIZATION auto, none, int8, or stored: GGUF blocks kept as stored even where
the CPU would dequantize them) or transformers[:DTYPE]. Both sides run the prompt and K greedy decode steps; every
forward's outputs are captured (embedding, each layer's attention output, MLP output and residual stream, the final
norm, the logits) and compared while both sides have seen the same tokens. The report gives per layer and step the
max abs / rel error, the cosine similarity and the error in units of the candidate dtype's precision, the first
layer out of tolerance and the first step whose greedy token differs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

# A layer is out of tolerance when its max relative error (max |a - b| / max |a|) or its cosine distance
# (1 - cosine) exceeds these, by the less precise dtype of the two sides. 16-bit: 32 units of the dtype's roundoff and
# a cosine distance a rounding drift does not reach in a 30-layer model (SmolLM2 in bf16 against float32: below 0.07
# and 2e-3), while a wrong weight, norm or rotary does. float32: two kernels' summation orders differ by far less.
TOLERANCE = {
    torch.float32: {"max_rel": 1e-3, "cosine_distance": 1e-6},
    torch.float16: {"max_rel": 32 * 2.0 ** -11, "cosine_distance": 1e-3},
    torch.bfloat16: {"max_rel": 32 * 2.0 ** -8, "cosine_distance": 5e-3},
}
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


@dataclass
class Side:
    """One side of a comparison, parsed from DEVICE:DTYPE[:QUANTIZATION] or transformers[:DTYPE]."""

    spec: str
    device: str
    dtype: torch.dtype
    quantization: str = "auto"

    @classmethod
    def parse(cls, spec: str) -> "Side":
        parts = spec.split(":")
        if parts[0] == "transformers":
            if len(parts) > 2:
                raise ValueError(f"side {spec!r}: transformers takes a dtype only (transformers:float32)")
            return cls(spec, "transformers", _dtype(parts[1] if len(parts) > 1 else "float32", spec))
        from rtp_llm.device import DEVICE_CLASSES

        if len(parts) not in (2, 3) or parts[0] not in DEVICE_CLASSES:
            *rest, last = DEVICE_CLASSES
            raise ValueError(f"side {spec!r}: expected DEVICE:DTYPE[:QUANTIZATION] with DEVICE "
                             f"{', '.join(rest)} or {last} (e.g. cpu:float32, npu:bfloat16, cpu:float32:stored), or "
                             "transformers[:DTYPE]")
        quant = parts[2] if len(parts) == 3 else "auto"
        if quant not in ("auto", "none", "int8", "stored"):
            raise ValueError(f"side {spec!r}: quantization {quant!r} is not auto, none, int8 or stored")
        return cls(spec, parts[0], _dtype(parts[1], spec), quant)


def _dtype(name: str, spec: str) -> torch.dtype:
    from rtp_llm.config.model_config import parse_dtype

    if name == "auto":
        raise ValueError(f"side {spec!r}: name the dtype (float32, bfloat16 or float16), not auto")
    try:
        return parse_dtype(name)
    except ValueError as exc:
        raise ValueError(f"side {spec!r}: {exc}") from None


@dataclass
class SideRun:
    side: Side
    forwards: list[dict[str, torch.Tensor]]  # per forward (0 = the prompt, then one per decode step): name -> float32
    tokens: list[int]


def run_rtp_llm(side: Side, model: str, prompt: list[int], steps: int, tokenizer: Optional[str] = None,
                tp: int = 1) -> SideRun:
    """The engine on `side`, one request, greedy, prefix cache off and the prompt in one step. tp: tensor-parallel
    ranks; rank 0's layers are observed (attention and MLP outputs are whole after their all-reduce)."""
    from rtp_llm.llm import LLM
    from rtp_llm.sampling import SamplingParams

    # a device option the CPU reads (blocks kept even where it would dequantize them); other devices ignore it
    options = {"cpu_gguf_blocks": "on"} if side.quantization == "stored" else {}
    quant = "auto" if side.quantization == "stored" else side.quantization
    forwards: list[dict[str, torch.Tensor]] = []

    def observer(name: str, t: torch.Tensor) -> None:
        if name == "embedding":
            forwards.append({})
        forwards[-1][name] = t.detach().float().cpu()

    with LLM(model, tokenizer=tokenizer, device=side.device, dtype=str(side.dtype).replace("torch.", ""), quantization=quant,
             enable_prefix_caching=False, max_num_batched_tokens=max(2048, len(prompt) + 1),
             max_model_len=len(prompt) + steps + 8, num_blocks=(len(prompt) + steps + 8) // 16 + 2,
             tp_size=tp, device_options=options) as llm:
        lm = llm.core.runner.model
        lm.observe(observer)
        try:
            out = llm.generate([prompt], SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True),
                               use_tqdm=False)[0].outputs[0]
        finally:
            lm.observe(None)
    return SideRun(side, forwards, list(out.token_ids))


def run_transformers(side: Side, model: str, prompt: list[int], steps: int) -> SideRun:
    """transformers on the CPU with forward hooks at the same points: embed_tokens, each layer's o_proj and mlp
    outputs and its output (the residual stream), the final norm and the logits of the last row."""
    from transformers import AutoModelForCausalLM

    from rtp_llm.models.loader import find_gguf

    gguf = find_gguf(model)
    if gguf:
        hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                  dtype=side.dtype)
    else:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=side.dtype)
    hf.eval()
    forwards: list[dict[str, torch.Tensor]] = []
    inner = hf.model

    def hook(name, last_row=False, first=False):
        def fn(_module, _inputs, output):
            t = output[0] if isinstance(output, tuple) else output
            if first:
                forwards.append({})
            t = t[0]
            forwards[-1][name] = (t[-1:] if last_row else t).detach().float()
        return fn

    handles = [inner.embed_tokens.register_forward_hook(hook("embedding", first=True))]
    for i, layer in enumerate(inner.layers):
        handles.append(layer.self_attn.o_proj.register_forward_hook(hook(f"layers.{i}.attention")))
        handles.append(layer.mlp.register_forward_hook(hook(f"layers.{i}.mlp")))
        handles.append(layer.register_forward_hook(hook(f"layers.{i}.residual")))
    handles.append(inner.norm.register_forward_hook(hook("norm", last_row=True)))
    handles.append(hf.lm_head.register_forward_hook(hook("logits", last_row=True)))
    tokens: list[int] = []
    try:
        with torch.no_grad():
            ids, past = torch.tensor([prompt]), None
            for _ in range(steps + 1):
                out = hf(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = int(out.logits[0, -1].argmax())
                tokens.append(nxt)
                ids = torch.tensor([[nxt]])
    finally:
        for h in handles:
            h.remove()
    return SideRun(side, forwards[: steps + 1], tokens)


def run_side(side: Side, model: str, prompt: list[int], steps: int, tokenizer=None, tp: int = 1) -> SideRun:
    if side.device == "transformers":
        if tp != 1:
            raise ValueError("the transformers side runs on one process (tp 1)")
        return run_transformers(side, model, prompt, steps)
    return run_rtp_llm(side, model, prompt, steps, tokenizer, tp)


@dataclass
class LayerDiff:
    step: int
    name: str
    max_abs: float
    max_rel: float
    cosine: float
    units: float  # max_abs in units of the coarser dtype's unit roundoff times max |baseline|
    within: bool


@dataclass
class Report:
    baseline: str
    candidate: str
    prompt_tokens: int
    steps: int
    tolerance: dict
    layers: list[LayerDiff] = field(default_factory=list)
    baseline_tokens: list[int] = field(default_factory=list)
    candidate_tokens: list[int] = field(default_factory=list)
    first_out_of_tolerance: Optional[dict] = None
    first_token_difference: Optional[int] = None
    compared_steps: int = 0

    def to_json(self) -> dict:
        d = asdict(self)
        d["layers"] = [asdict(x) for x in self.layers]
        return d


def diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    a, b = a.double().flatten(), b.double().flatten()
    max_abs = float((a - b).abs().max()) if a.numel() else 0.0
    scale = float(a.abs().max()) if a.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    na, nb = float(a.norm()), float(b.norm())
    cosine = float(a @ b) / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    return max_abs, max_rel, cosine


def compare_runs(base: SideRun, cand: SideRun) -> Report:
    coarse = max((base.side.dtype, cand.side.dtype), key=lambda d: UNIT_ROUNDOFF[d])
    tol = TOLERANCE[coarse]
    report = Report(base.side.spec, cand.side.spec, 0, len(base.forwards) - 1, {"dtype": str(coarse), **tol},
                    baseline_tokens=base.tokens, candidate_tokens=cand.tokens)
    report.prompt_tokens = int(base.forwards[0]["embedding"].shape[0]) if base.forwards else 0
    diverged = next((i for i, (x, y) in enumerate(zip(base.tokens, cand.tokens)) if x != y), None)
    report.first_token_difference = diverged
    # forward s (s >= 1) takes the token sampled at s - 1: comparable while every token before it agreed
    last = len(base.forwards) - 1 if diverged is None else diverged
    report.compared_steps = min(last, len(cand.forwards) - 1) + 1
    for s in range(report.compared_steps):
        for name, a in base.forwards[s].items():
            if name not in cand.forwards[s]:
                continue
            max_abs, max_rel, cosine = diff(a, cand.forwards[s][name])
            scale = float(a.abs().max()) or 1.0
            units = max_abs / (UNIT_ROUNDOFF[coarse] * scale)
            within = max_rel <= tol["max_rel"] and 1 - cosine <= tol["cosine_distance"]
            report.layers.append(LayerDiff(s, name, max_abs, max_rel, cosine, units, within))
            if not within and report.first_out_of_tolerance is None:
                report.first_out_of_tolerance = {"step": s, "name": name}
    return report


def compare(model: str, prompt: list[int], baseline: str, candidate: str, steps: int = 4,
            candidate_model: Optional[str] = None, tokenizer: Optional[str] = None, baseline_tp: int = 1,
            candidate_tp: int = 1) -> tuple[Report, SideRun, SideRun]:
    """Runs both sides and compares them; returns the report and both runs (their captured tensors).
    candidate_model: another checkpoint of the same architecture for the candidate (a converted or re-quantized
    copy); tokenizer: where the engine finds one when the model has none (the prompt is token ids either way)."""
    base = run_side(Side.parse(baseline), model, prompt, steps, tokenizer, baseline_tp)
    cand = run_side(Side.parse(candidate), candidate_model or model, prompt, steps, tokenizer, candidate_tp)
    return compare_runs(base, cand), base, cand


def format_table(report: Report) -> str:
    lines = [f"baseline {report.baseline}  vs  candidate {report.candidate}: {report.prompt_tokens} prompt tokens, "
             f"{report.steps} decode steps (tolerance {report.tolerance})",
             f"{'step':>4}  {'layer':<24} {'max abs':>10} {'max rel':>10} {'cosine':>12} {'units':>10}  ok"]
    for x in report.layers:
        lines.append(f"{x.step:>4}  {x.name:<24} {x.max_abs:>10.3e} {x.max_rel:>10.3e} {x.cosine:>12.9f} "
                     f"{x.units:>10.1f}  {'yes' if x.within else 'NO'}")
    first = report.first_out_of_tolerance
    lines.append("first out of tolerance: " + (f"step {first['step']} {first['name']}" if first else "none"))
    lines.append("first differing token: " + ("none" if report.first_token_difference is None else
                                               f"step {report.first_token_difference} (baseline "
                                               f"{report.baseline_tokens[report.first_token_difference]}, candidate "
                                               f"{report.candidate_tokens[report.first_token_difference]})"))
    if report.compared_steps < report.steps + 1:
        lines.append(f"layers compared for steps 0..{report.compared_steps - 1}: later steps took different tokens")
    return "\n".join(lines)


def plot(report: Report, path: str) -> None:
    """Max relative error by layer, one line per step (log scale), the tolerance as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(x.name for x in report.layers))
    fig, ax = plt.subplots(figsize=(min(24, max(6, len(names) * 0.3)), 4.5))
    for s in sorted({x.step for x in report.layers}):
        rows = {x.name: x.max_rel for x in report.layers if x.step == s}
        ax.plot(range(len(names)), [max(rows.get(n, math.nan), 1e-12) for n in names], marker=".",
                label="prompt" if s == 0 else f"step {s}")
    ax.axhline(report.tolerance["max_rel"], linestyle="--", color="grey", label="tolerance")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    ax.set_ylabel("max relative error")
    ax.set_title(f"{report.candidate} vs {report.baseline}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def dump(base: SideRun, cand: SideRun, directory: str) -> None:
    """Both sides' captured tensors as safetensors (step{S}.{name}), for offline diffing."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    for tag, run in (("baseline", base), ("candidate", cand)):
        tensors = {f"step{s}.{name}": t.contiguous() for s, fw in enumerate(run.forwards) for name, t in fw.items()}
        save_file(tensors, os.path.join(directory, f"{tag}.safetensors"), metadata={"side": run.side.spec})


def _token_ids(args, model: str) -> list[int]:
    if args.token_ids:
        return [int(t) for t in args.token_ids.split(",") if t.strip()]
    from rtp_llm.tokenizer import Tokenizer

    return Tokenizer.load(args.tokenizer or model).encode(args.prompt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtp_llm.tools.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF directory or .gguf (default: the embedded default model)")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--token_ids", default=None, help="comma-separated prompt token ids (instead of --prompt)")
    ap.add_argument("--tokenizer", default=None, help="where the tokenizer is, when not beside the model")
    ap.add_argument("--candidate_model", default=None, help="the candidate's checkpoint, when not --model")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks of the candidate (the baseline runs 1)")
    ap.add_argument("--baseline", default="cpu:float32")
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--steps", type=int, default=4, help="greedy decode steps after the prompt")
    ap.add_argument("--json", default=None, help="write the report as JSON here")
    ap.add_argument("--plot", default=None, help="write a PNG of the error by layer here")
    ap.add_argument("--dump", default=None, help="write both sides' tensors as safetensors into this directory")
    args = ap.parse_args(argv)
    from rtp_llm.models.default_model import default_model_path

    model = args.model or default_model_path()
    try:
        report, base, cand = compare(model, _token_ids(args, model), args.baseline, args.candidate, args.steps,
                                     candidate_model=args.candidate_model, tokenizer=args.tokenizer,
                                     candidate_tp=args.tp)
    except ValueError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=1)
    if args.plot:
        plot(report, args.plot)
    if args.dump:
        dump(base, cand, args.dump)
    return 0 if report.first_out_of_tolerance is None else 1


if __name__ == "__main__":
    sys.exit(main())
