"""The CPU LoRA kernel (rtp_llm/cpp/cpu/lora_add.cc, CpuOps.lora_add) against float64 arithmetic written out here:
y[rows] += (x[rows] @ a_t) @ bt, several adapter groups in one call, float32 and bfloat16; a row's bits do not depend
on its group or the other groups; bad calls are refused by name."""

import pytest
import torch

from rtp_llm.device.cpu.ops import CpuOps

OPS = CpuOps()


def _case(tokens=13, k=70, n=530, ranks=(16, 3, 48), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=g)
    y = torch.randn(tokens, n, generator=g)
    weights = [(torch.randn(k, r, generator=g) / 8, torch.randn(r, n, generator=g) / 8) for r in ranks]
    return x, y, weights


def _expected(x, y, groups):
    want = y.double().clone()
    for rows, a_t, bt in groups:
        idx = torch.arange(x.shape[0]) if rows is None else rows
        want[idx] += (x[idx].double() @ a_t.double()) @ bt.double()
    return want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_groups_add_their_deltas_to_their_rows_only(dtype):
    x, y, (w0, w1, w2) = _case()
    x, y = x.to(dtype), y.to(dtype)
    groups = [(torch.tensor([0, 5, 6]), *w0), (torch.tensor([12, 1]), *w1), (torch.tensor([3, 4, 7, 8, 9]), *w2)]
    got = y.clone()
    OPS.lora_add(x, got, groups)
    want = _expected(x, y, groups)
    untouched = [2, 10, 11]
    assert torch.equal(got[untouched], y[untouched])
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    else:  # one rounding of the float32 sum to bf16: within one bf16 step of the exact value
        assert ((got.double() - want).abs() <= want.abs() * 2 ** -8 + 1e-2).all()


def test_every_row_alone_is_the_same_bits_as_in_a_step():
    x, y, (w0, w1, w2) = _case(tokens=40)
    groups = [(torch.arange(0, 40, 3), *w0), (torch.arange(1, 40, 3), *w1), (torch.arange(2, 40, 3), *w2)]
    together = y.clone()
    OPS.lora_add(x, together, groups)
    for rows, a, bt in groups:
        for r in rows.tolist():
            alone = y[r:r + 1].clone()
            OPS.lora_add(x[r:r + 1], alone, [(None, a, bt)])
            assert torch.equal(alone[0], together[r]), r


def test_bad_calls_are_refused_by_name():
    x, y, (w0, w1, _) = _case()
    with pytest.raises(RuntimeError, match="in two groups"):
        OPS.kernels.lora_add_(y, x, [torch.tensor([1, 2]), torch.tensor([2])], [w0[0], w1[0]], [w0[1], w1[1]])
    with pytest.raises(RuntimeError, match="outside"):
        OPS.kernels.lora_add_(y, x, [torch.tensor([13])], [w0[0]], [w0[1]])
    with pytest.raises(RuntimeError, match="a_t \\[K, r\\] and bt \\[r, N\\]"):
        OPS.kernels.lora_add_(y, x, [None], [w0[0]], [w1[1]])
