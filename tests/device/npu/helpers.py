"""The NPU engine tests' shared workload and the bf16 rule their comparisons follow.

The bf16 rule: two bf16 computations of the same model round differently (kernels sum in other orders), so they
may pick different greedy tokens only where the top-2 logit gap is within the rounding's reach, MARGIN_ULPS bf16
units (2^-8 relative) of the largest |logit|. Against transformers every token is checked teacher-forced: its
logit must be within that margin of the reference's maximum, which forces the exact argmax wherever the gap is
larger. Against another engine the two token streams must agree up to their first difference, and that difference
must sit at a near tie of the first engine's own distribution."""

import pytest
import torch

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.models.default_model import default_model_path
from rtp_llm.sampling import SamplingParams
from rtp_llm.tokenizer import Tokenizer
from tests.engine.helpers import driver, run_all

SHARED = [(i * 11) % 240 + 5 for i in range(260)]                      # > 2 blocks of 128
PROMPTS = [SHARED[:150] + [7, 8, 9], [5, 6, 7, 8], SHARED[:140] + [1, 2], list(range(30, 70))]
MAX_TOKENS = [12, 20, 8, 16]
ARRIVALS = [0, 0, 6, 3]  # request 2 arrives after request 0 has filled its first block


MARGIN_ULPS = 4
BF16_REL = 2.0 ** -8


def greedy(n, logprobs=2):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=logprobs)


def margin_of(logits: torch.Tensor) -> float:
    return MARGIN_ULPS * BF16_REL * float(logits.abs().max())


def reference_logits(hf_bf16, prompt, tokens) -> torch.Tensor:
    with torch.no_grad():
        return hf_bf16(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()


def assert_transformers_agree(hf_bf16, prompt, tokens, roundings=1):
    """Teacher-forced: each token's bf16 transformers logit is within the rounding margin of the maximum (times
    `roundings`, the roundings each weight carries). Returns how many positions had a gap larger than the margin
    (where the argmax itself was required)."""
    logits = reference_logits(hf_bf16, prompt, tokens)
    margin = roundings * margin_of(logits)
    strict = 0
    for j, t in enumerate(tokens):
        top2 = logits[j].topk(2).values
        assert float(top2[0] - logits[j, t]) <= margin, (j, t, float(top2[0]), float(logits[j, t]), margin)
        strict += float(top2[0] - top2[1]) > margin
    return strict


def assert_engines_agree(a, b, margin):
    """Greedy outputs of two engines (CompletionOutputs with top-2 logprobs): equal up to the first difference,
    which must be a near tie of a's distribution: a logprob gap (= the logit gap) within `margin`, the bf16 rule's
    reach for these logits (margin_of the reference's). Returns the tokens compared."""
    for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)):
        if x != y:
            top = a.logprobs[j].top
            gap = top[0][1] - dict(top).get(y, top[1][1])
            assert gap <= margin, (j, x, y, top, margin)
            return j
    return len(a.token_ids)


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
