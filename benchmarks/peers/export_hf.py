"""Writes the embedded SmolLM2 GGUF as a float32 Hugging Face directory (safetensors + config + tokenizer), so
peers that do not read GGUF (vLLM) run exactly the weights rtp_llm runs. The tensors are the float32 values
the loader dequantizes (tests/models/test_smollm2_gguf.py holds them to transformers' own GGUF loading);
config and tokenizer come from transformers' GGUF reader. The harness checks the greedy tokens agree.

    python -m benchmarks.peers.export_hf [--out DIR]     # prints the directory
"""

from __future__ import annotations

import argparse
import os

DEFAULT_DIR = os.path.expanduser("~/.cache/rtp_llm/SmolLM2-135M-Instruct-f32")


def export(out: str = DEFAULT_DIR) -> str:
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    from rtp_llm.models.default_model import default_model_path
    from rtp_llm.models.loader import iter_checkpoint, load_config
    from rtp_llm.models.lazy_tensor import read_tensor

    gguf = default_model_path()
    src, name = os.path.dirname(gguf), os.path.basename(gguf)
    tmp = out + ".partial"
    os.makedirs(tmp, exist_ok=True)
    config = AutoConfig.from_pretrained(src, gguf_file=name)
    config.dtype = torch.float32
    config.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[
        config.model_type]]
    config.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(tmp)
    tensors = {n: read_tensor(t).to(torch.float32).contiguous()
               for n, t in iter_checkpoint(gguf, load_config(gguf))}
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_DIR)
    print(export(ap.parse_args().out))
