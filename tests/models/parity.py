"""What the parity tests share: prompts of mixed lengths and transformers' own greedy continuation of one, with its
raw logits per step."""

import torch

STEPS = 32
PROMPTS = [[5, 17, 42, 9, 3], list(range(30, 47)), [(i * 37) % 250 + 3 for i in range(33)]]


def hf_greedy(hf, prompt, steps=STEPS):
    """(tokens, per-step raw logits) from transformers' own generate with its KV cache."""
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                          output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), [l[0].float() for l in out.logits]
