"""The C++ CPU twin of top-k/top-p is bit-for-bit equal to the torch implementation of the
documented algorithm (rtp_llm/device/torch_ops.py), ties included, for every dtype and edge case."""

import pytest
import torch

from rtp_llm._native import ops
from rtp_llm.device.torch_ops import apply_top_k_top_p


def _rows(kind, rows, vocab, gen):
    if kind == "normal":
        return torch.randn(rows, vocab, generator=gen) * 3
    if kind == "ties":  # quarter steps in a narrow range: many equal values at every threshold
        return torch.randint(-8, 8, (rows, vocab), generator=gen).float() / 4
    if kind == "peaked":
        x = torch.randn(rows, vocab, generator=gen)
        x[:, :5] += 12
        return x
    if kind == "flat":
        return torch.zeros(rows, vocab)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["normal", "ties", "peaked", "flat"])
@pytest.mark.parametrize("vocab", [1, 2, 7, 300, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_twin_equals_torch_bit_for_bit(kind, vocab, dtype):
    gen = torch.Generator().manual_seed(vocab)
    x = _rows(kind, 6, vocab, gen).to(dtype)
    ks = [1, 2, vocab, vocab + 5, max(1, vocab // 3)]
    ps = [1e-6, 0.1, 0.5, 0.9, 1.0]
    for k in ks:
        for p in ps:
            kt = torch.tensor([k, 1, vocab, k, 2, vocab + 1][:6])
            pt = torch.tensor([p, p, 0.3, 1.0, 0.95, p], dtype=torch.float32)
            for kk, pp in ((kt, pt), (kt, None), (None, pt)):
                want = apply_top_k_top_p(x, kk, pp)
                got = ops().apply_top_k_top_p(x, kk, pp)
                assert torch.equal(got, want), (kind, vocab, dtype, k, p, kk is None, pp is None)


def test_twin_on_a_real_vocabulary_size():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, 151936, generator=gen) * 2
    for k, p in ((50, 0.9), (151936, 0.95), (1000, 0.5)):
        kt, pt = torch.full((8,), k), torch.full((8,), p)
        assert torch.equal(ops().apply_top_k_top_p(x, kt, pt), apply_top_k_top_p(x, kt, pt))


def test_the_cpu_sampler_uses_the_twin():
    from rtp_llm.device import CpuDevice

    cpu_ops = CpuDevice().ops()
    x = torch.randn(3, 500)
    k, p = torch.tensor([5, 50, 500]), torch.tensor([0.9, 0.5, 1.0])
    assert cpu_ops.name == "cpu"
    assert torch.equal(cpu_ops.top_k_top_p(x, k, p), apply_top_k_top_p(x, k, p))
