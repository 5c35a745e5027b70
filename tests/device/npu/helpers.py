"""The NPU engine tests' shared workload; the bf16 rule their comparisons follow is tests/models/bf16_rule.py."""

import pytest

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.models.default_model import default_model_path
from rtp_llm.sampling import SamplingParams
from rtp_llm.tokenizer import Tokenizer
from tests.engine.helpers import driver, run_all
from tests.models.bf16_rule import (  # noqa: F401  (the NPU tests import the rule from here)
    assert_engines_agree, assert_transformers_agree, margin_of, reference_logits)

SHARED = [(i * 11) % 240 + 5 for i in range(260)]                      # > 2 blocks of 128
PROMPTS = [SHARED[:150] + [7, 8, 9], [5, 6, 7, 8], SHARED[:140] + [1, 2], list(range(30, 70))]
MAX_TOKENS = [12, 20, 8, 16]
ARRIVALS = [0, 0, 6, 3]  # request 2 arrives after request 0 has filled its first block


def greedy(n, logprobs=2):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=logprobs)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.load(default_model_path())


def engine(path, tok, device, **kw):
    args = dict(device=device, num_blocks=24, max_model_len=512, max_num_batched_tokens=512)
    if device == "cpu":  # the CPU reference in the NPU's dtype
        args.update(dtype="bfloat16", block_size=16, num_blocks=200)
    args.update(kw)
    return driver(EngineConfig(model=str(path), **args), tokenizer=tok)


def staggered(eng):
    return run_all(eng, [(ARRIVALS[i], f"r{i}", PROMPTS[i], greedy(MAX_TOKENS[i])) for i in range(len(PROMPTS))])


def plain_attention(q, k_cache, v_cache, block_table, q_lens, kv_lens, scale, kv_heads):
    """The fused attention's reference: float64 loops over sequences, heads and positions; causal, the queries at the
    end of the keys; block_table a host list of rows."""
    import torch

    n_heads, bs = q.shape[1], k_cache.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    start = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        keys = torch.stack([k_cache[block_table[b][p // bs], p % bs] for p in range(kl)]).double()
        vals = torch.stack([v_cache[block_table[b][p // bs], p % bs] for p in range(kl)]).double()
        for h in range(n_heads):
            g = h // (n_heads // kv_heads)
            for i in range(ql):
                visible = kl - ql + i + 1
                w = torch.softmax((keys[:visible, g] @ q[start + i, h].double()) * scale, 0)
                out[start + i, h] = w @ vals[:visible, g]
        start += ql
    return out
