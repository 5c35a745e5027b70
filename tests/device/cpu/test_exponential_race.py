"""The CPU draw (rtp_llm/cpp/cpu/exponential_race.cc) against the torch version every other device runs
(TorchOps.exponential_race over device/random.py's uniforms): the same token on every row, probabilities of 0 and
uniforms of exactly 1.0 included. The token distribution itself is checked in tests/sampling/test_sampler.py."""

import pytest
import torch

from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.device.random import uniform
from rtp_llm.device.torch_ops import TorchOps


def _probs(kind: str, rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    logits = torch.randn(rows, vocab, generator=gen)
    if kind == "peaked":
        logits = logits * 8
    elif kind == "flat":
        logits = torch.zeros(rows, vocab)
    elif kind == "sparse":  # top-k / top-p / a grammar left a few tokens
        keep = torch.rand(rows, vocab, generator=gen) < 0.01
        keep[:, 0] = True
        logits = torch.where(keep, logits, float("-inf"))
    elif kind == "one":
        logits = torch.full((rows, vocab), float("-inf"))
        logits[:, vocab // 2] = 0.0
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("kind", ["normal", "peaked", "flat", "sparse", "one"])
@pytest.mark.parametrize("vocab", [1, 7, 300, 5000, 151936])
def test_same_token_as_the_torch_version(kind, vocab):
    gen = torch.Generator().manual_seed(vocab)
    rows = 8 if vocab > 10000 else 64
    probs = _probs(kind, rows, vocab, gen)
    seeds = torch.randint(-(1 << 62), 1 << 62, (rows,), generator=gen)
    for step in (0, 1, 4095):
        steps = torch.full((rows,), step, dtype=torch.int64)
        want = TorchOps().exponential_race(probs, seeds, steps)
        assert torch.equal(CpuOps().exponential_race(probs, seeds, steps), want), (kind, vocab, step)


def test_a_uniform_of_one_scores_minus_infinity_and_probability_zero_scores_zero():
    """U rounds to exactly 1.0 about once in 2^24 draws: E = -0 makes that token's score -inf (it loses even as
    the only token with probability), while tokens of probability 0 score 0, as in the torch version."""
    vocab, rows = 1 << 18, 96
    u = uniform(torch.arange(rows, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64), vocab)
    hits = (u == 1.0).nonzero().tolist()
    assert hits, "no uniform of exactly 1.0 in 25M draws: pick more rows"
    seed, token = hits[0]
    seeds, steps = torch.tensor([seed]), torch.tensor([0])
    only = torch.zeros(1, vocab)
    only[0, token] = 1.0  # every other token has probability 0: all score 0, the first one wins
    for probs in (only, torch.full((1, vocab), 1.0 / vocab)):
        got = CpuOps().exponential_race(probs, seeds, steps)
        assert got.item() != token
        assert torch.equal(got, TorchOps().exponential_race(probs, seeds, steps))
    assert CpuOps().exponential_race(only, seeds, steps).item() == 0


def test_rows_do_not_depend_on_each_other():
    gen = torch.Generator().manual_seed(5)
    probs = _probs("normal", 16, 2000, gen)
    seeds, steps = torch.arange(16), torch.arange(16) * 3
    full = CpuOps().exponential_race(probs, seeds, steps)
    for r in range(16):
        assert CpuOps().exponential_race(probs[r:r + 1], seeds[r:r + 1], steps[r:r + 1]).item() == full[r].item()
