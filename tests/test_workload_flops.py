"""benchmarks/gemm_rate.workload_flops against torch's FLOP counter on a transformers Llama that generates the
same workload token by token (each token attends to exactly its causal context, the LM head only on the rows a
generation samples), for two shapes of the architecture."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.gemm_rate import workload_flops


def _counted(cfg, num_prompts: int, prompt_len: int, new_tokens: int) -> int:
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (num_prompts, prompt_len + new_tokens - 1))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        cache = None
        # the prompt but its last token: decoder layers only (no engine computes their logits)
        for t in range(prompt_len - 1):
            cache = model.model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).past_key_values
        # the last prompt token, then every generated token but the last: layers and the LM head
        for t in range(prompt_len - 1, ids.shape[1]):
            cache = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).past_key_values
    return counter.get_total_flops()


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, None), (4, 4, 24)])
def test_workload_flops_match_torch_flop_counter(heads, kv_heads, head_dim):
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, vocab_size=300, attn_implementation="eager",
                      **({"head_dim": head_dim} if head_dim else {}))
    expected = _counted(cfg, num_prompts=2, prompt_len=5, new_tokens=4)
    assert workload_flops(cfg, 2, 5, 4) == pytest.approx(expected, rel=1e-9)
