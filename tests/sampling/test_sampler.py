"""The sampler against references it did not write: transformers' logits processors, a direct
row-by-row implementation of the documented npu_top_k_top_p algorithm, and the distributions that
temperature / top-k / top-p / min-p define (checked statistically with fixed seeds)."""

import math

import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from rtp_llm.device.torch_ops import apply_top_k_top_p
from rtp_llm.sampling import Sampler, SamplingBatch, SamplingParams

V = 12
LOGITS = torch.tensor([2.0, 1.5, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, -2.0, 0.25, 0.75])


def direct_top_k_top_p(row: list[float], k: int, p: float) -> list[float]:
    """The documented algorithm, one row, plain Python."""
    n = len(row)
    order = sorted(range(n), key=lambda i: row[i])  # Python's sort is stable
    vals = [row[i] for i in order]
    thr = vals[n - min(max(k, 1), n)]
    vals = [v if v >= thr else -math.inf for v in vals]
    mx = max(vals)
    ex = [math.exp(v - mx) if v != -math.inf else 0.0 for v in vals]
    total = sum(ex)
    cum, keep = 0.0, []
    for j, e in enumerate(ex):
        cum += e / total
        keep.append(j == n - 1 or cum > 1 - p)
    out = [0.0] * n
    for j, i in enumerate(order):
        out[i] = vals[j] if keep[j] else -math.inf
    return out


@pytest.mark.parametrize("k,p", [(1, 1.0), (2, 1.0), (3, 1.0), (V, 1.0), (V + 5, 1.0), (V, 0.5), (4, 0.7),
                                 (3, 0.01), (V, 1e-9), (5, 0.999)])
def test_top_k_top_p_mask_equals_the_documented_algorithm_ties_included(k, p):
    rows = torch.stack([LOGITS, LOGITS.flip(0), torch.zeros(V), torch.randn(V, generator=torch.Generator().manual_seed(k))])
    out = apply_top_k_top_p(rows, torch.full((4,), k), torch.full((4,), p))
    for r in range(4):
        want = direct_top_k_top_p(rows[r].tolist(), k, p)
        assert out[r].tolist() == pytest.approx(want)
    # Ties at the k-th value survive: k=2 keeps 2.0 and all three 1.5s.
    if (k, p) == (2, 1.0):
        assert (out[0] > -math.inf).sum().item() == 4


@pytest.mark.parametrize("k,p", [(3, 1.0), (V, 0.6), (5, 0.8)])
def test_top_k_top_p_equals_transformers_warpers(k, p):
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    ours = apply_top_k_top_p(logits, torch.full((6,), k), torch.full((6,), p))
    ref = logits
    if k < 50:
        ref = TopKLogitsWarper(k)(None, ref)
    if p < 1:
        ref = TopPLogitsWarper(p)(None, ref)
    assert torch.equal(ours.isinf(), ref.isinf())
    assert torch.equal(ours[~ours.isinf()], ref[~ref.isinf()])


def test_repetition_penalty_matches_transformers():
    torch.manual_seed(1)
    logits = torch.randn(3, 40)
    prompts = [[1, 2, 3], [5, 5, 39], [0]]
    outputs = [[7], [], [1, 1, 2]]
    params = [SamplingParams(temperature=0, repetition_penalty=x) for x in (1.3, 0.8, 2.0)]
    b = SamplingBatch.build(params, [0] * 3, [0] * 3, prompts, outputs, 40)
    ours = Sampler().apply_penalties(logits, b)
    for r, x in enumerate((1.3, 0.8, 2.0)):
        ids = torch.tensor([prompts[r] + outputs[r]])
        ref = RepetitionPenaltyLogitsProcessor(x)(ids, logits[r:r + 1].clone())
        assert torch.allclose(ours[r], ref[0])


def test_presence_and_frequency_penalties_follow_the_openai_definition():
    logits = torch.zeros(1, 6)
    b = SamplingBatch.build([SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)], [0], [0],
                            [[4, 4, 4]], [[1, 1, 1, 3]], 6)
    ours = Sampler().apply_penalties(logits, b)[0].tolist()
    # logit - count * frequency - (count > 0) * presence; prompt tokens are not penalised.
    assert ours == pytest.approx([0, -(3 * 0.25 + 0.5), 0, -(0.25 + 0.5), 0, 0])


def _ops(name: str):
    if name == "torch":
        return None  # Sampler's default: TorchOps, the reference every device runs unless it has a kernel
    from rtp_llm.device.cpu.ops import CpuOps
    return CpuOps()


def _empirical(logits: torch.Tensor, params: SamplingParams, n: int = 40000, ops=None) -> torch.Tensor:
    rows = logits.expand(n, -1)
    b = SamplingBatch.build([params] * n, list(range(n)), [0] * n, [[]] * n, [[]] * n, logits.shape[-1])
    toks = Sampler(ops)(rows, b).token_ids
    return torch.bincount(toks, minlength=logits.shape[-1]).float() / n


def _expected(logits: torch.Tensor, warpers) -> torch.Tensor:
    x = logits[None].clone()
    for w in warpers:
        x = w(None, x)
    return torch.softmax(x, dim=-1)[0]


@pytest.mark.parametrize("params,warpers", [
    (SamplingParams(temperature=1.0), []),
    (SamplingParams(temperature=0.5), [TemperatureLogitsWarper(0.5)]),
    (SamplingParams(temperature=2.0), [TemperatureLogitsWarper(2.0)]),
    (SamplingParams(temperature=1.0, top_k=3), [TopKLogitsWarper(3)]),
    (SamplingParams(temperature=0.7, top_p=0.8), [TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.8)]),
    (SamplingParams(temperature=1.0, top_k=5, top_p=0.9), [TopKLogitsWarper(5), TopPLogitsWarper(0.9)]),
    (SamplingParams(temperature=1.0, min_p=0.3), [MinPLogitsWarper(0.3)]),
])
@pytest.mark.parametrize("ops", ["torch", "cpu"])
def test_samples_follow_the_defined_distribution(params, warpers, ops):
    got = _empirical(LOGITS, params, ops=_ops(ops))
    want = _expected(LOGITS, warpers)
    # 40k draws: one standard error is <= 0.0025; 0.012 is ~5 of them.
    assert (got - want).abs().max().item() < 0.012
    assert torch.all(got[want == 0] == 0)  # never a token the filters removed


def test_greedy_is_argmax_and_logprobs_are_of_the_raw_distribution():
    torch.manual_seed(2)
    logits = torch.randn(4, 30)
    b = SamplingBatch.build([SamplingParams(temperature=0, logprobs=3)] * 4, [0] * 4, [0] * 4, [[]] * 4, [[]] * 4, 30)
    out = Sampler()(logits, b)
    assert torch.equal(out.token_ids, logits.argmax(-1))
    ref = torch.log_softmax(logits, -1)
    assert torch.allclose(out.logprobs, ref.max(-1).values)
    assert torch.equal(out.top_ids, ref.topk(3, -1).indices)


def test_seeded_draws_do_not_depend_on_the_batch_they_share():
    torch.manual_seed(3)
    logits = torch.randn(5, 100)
    params = [SamplingParams(temperature=1.0, seed=s) for s in (11, 22, 33, 44, 55)]
    steps = [0, 3, 1, 7, 2]
    full = Sampler()(logits, SamplingBatch.build(params, [11, 22, 33, 44, 55], steps, [[]] * 5, [[]] * 5, 100))
    for r in range(5):
        alone = Sampler()(logits[r:r + 1], SamplingBatch.build([params[r]], [params[r].seed], [steps[r]],
                                                              [[]], [[]], 100))
        assert alone.token_ids.item() == full.token_ids[r].item()
    # Another step of the same seed is another draw.
    draws = {Sampler()(logits[:1], SamplingBatch.build([params[0]], [11], [s], [[]], [[]], 100)).token_ids.item()
             for s in range(40)}
    assert len(draws) > 1


def test_invalid_params_name_the_field():
    for kwargs, field in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
                          ({"top_k": -2}, "top_k"), ({"n": 0}, "n"), ({"min_p": 1.5}, "min_p")]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)


def test_a_token_of_probability_zero_is_never_drawn_even_when_its_uniform_is_one():
    """uniform() rounds to exactly 1.0 in float32 about once in 2^24 draws (E = -log U = 0): a token the filters
    removed (probability 0) must still lose, not become 0 / 0 = NaN, which argmax picks."""
    from rtp_llm.device.random import uniform

    vocab, rows = 1 << 18, 96
    u = uniform(torch.arange(rows, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64), vocab)
    hits = (u == 1.0).nonzero().tolist()
    assert hits, "no uniform of exactly 1.0 in 25M draws: pick more rows"
    seed, token = hits[0]
    logits = torch.zeros(1, vocab)
    logits[0, token] = float("-inf")  # e.g. masked by a grammar or allowed_token_ids
    for params in (SamplingParams(temperature=1.0, seed=seed),
                   SamplingParams(temperature=1.0, seed=seed, allowed_token_ids=[token - 1, token + 1])):
        if params.allowed_token_ids:
            logits = torch.zeros(1, vocab)
        b = SamplingBatch.build([params], [seed], [0], [[]], [[]], vocab)
        got = Sampler()(logits, b).token_ids.item()
        assert got != token


def test_grammar_masks_restrict_their_rows_and_win_over_an_empty_intersection():
    """A grammar row samples only what its mask allows (greedy and seeded), other rows are untouched; where
    allowed_token_ids leaves nothing the grammar allows, the grammar's mask alone decides."""
    torch.manual_seed(5)
    vocab = 64
    logits = torch.randn(3, vocab)
    allowed = torch.zeros(2, vocab, dtype=torch.bool)
    allowed[0, [3, 9, 40]] = True
    allowed[1, [7, 8]] = True
    for temp in (0.0, 1.0):
        params = [SamplingParams(temperature=temp, seed=1), SamplingParams(temperature=temp, seed=2),
                  SamplingParams(temperature=temp, seed=3, allowed_token_ids=[1, 2])]
        b = SamplingBatch.build(params, [1, 2, 3], [0] * 3, [[]] * 3, [[]] * 3, vocab)
        free = Sampler()(logits, b).token_ids
        b.grammar = (torch.tensor([0, 2]), allowed)
        got = Sampler()(logits, b).token_ids.tolist()
        assert got[0] in (3, 9, 40) and got[1] == free[1].item() and got[2] in (7, 8)
        if temp == 0:
            assert got[0] == max((3, 9, 40), key=lambda t: logits[0, t].item())
            assert got[2] == max((7, 8), key=lambda t: logits[2, t].item())
