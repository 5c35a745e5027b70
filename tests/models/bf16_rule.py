"""The bf16 rule, for comparing bf16 computations of one model (any device).

Two bf16 computations of the same model round differently (kernels sum in other orders), so they may pick different
greedy tokens only where the top-2 logit gap is within the rounding's reach, MARGIN_ULPS bf16 units (2^-8 relative)
of the largest |logit|. Against transformers every token is checked teacher-forced: its logit must be within that
margin of the reference's maximum, which forces the exact argmax wherever the gap is larger. Against another engine
the two token streams must agree up to their first difference, and that difference must sit at a near tie of the
first engine's own distribution."""

import torch

MARGIN_ULPS = 4
BF16_REL = 2.0 ** -8


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
