"""Adapters made with peft on tiny checkpoints, and transformers + peft's greedy tokens and logprobs to compare the
engine with (tests/engine/test_lora*.py, tests/distributed/test_tp_lora.py)."""

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PIN = (ROOT / "benchmarks/peers/requirements-llamacpp.txt").read_text().split("llama-cpp-python==")[1].split()[0]
CONVERTER = ROOT / ".deps" / f"llama.cpp-{PIN}" / "convert_lora_to_gguf.py"  # unpacked by scripts/setup.sh
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base, out, r, targets=ALL, rslora=False, alpha=None, seed=0, bf16_values=False):
    """A peft adapter with random A and B (init_lora_weights=False: a zero B would change nothing), B scaled up so
    that a missed or misplaced delta shows in the logits; returns the transformers + peft model (unmerged). base:
    a checkpoint directory or a transformers model (wrapped in place). bf16_values: every value a bf16 one, so that
    a bf16 copy of the adapter holds the same numbers."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    if not isinstance(base, torch.nn.Module):
        base = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha or 2 * r, target_modules=targets,
                                            use_rslora=rslora, init_lora_weights=False, lora_dropout=0.0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                scaled = p * (20.0 if "lora_B" in name else 1.0)
                p.copy_(scaled.bfloat16().float() if bf16_values else scaled)
    model.save_pretrained(str(out))
    return model.eval()


def reference(model, prompt, n):
    """Greedy tokens and their logprobs, from the full sequence's logits at every step."""
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            t = int(logp.argmax())
            ids.append(t)
            lps.append(float(logp[t]))
    return ids[len(prompt):], lps


def convert(adapter_dir, base_config_dir, out, outtype="f32") -> str:
    """llama.cpp's converter, as its users run it: --base is the base's Hugging Face config directory."""
    assert CONVERTER.exists(), f"{CONVERTER} missing: scripts/setup.sh unpacks llama.cpp's converters into .deps/"
    run = subprocess.run([sys.executable, str(CONVERTER), "--base", str(base_config_dir), "--outfile", str(out),
                          "--outtype", outtype, str(adapter_dir)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return str(out)
