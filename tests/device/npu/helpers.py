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
