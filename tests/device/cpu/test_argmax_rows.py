"""argmax_rows (rtp_llm/cpp/cpu/argmax_rows.cc): the greedy token of each row of full logits is exactly
torch.argmax's, ties to the lowest index included, on float32 and bf16 rows of every length around the kernel's
32-wide steps; rows holding a NaN come back -1 and CpuOps.greedy_tokens hands them to torch.argmax; the greedy steps
of a bf16 head go through it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rtp_llm._native import ops as native_ops
from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.layers.linear import Linear

K = native_ops()


def _rows(n: int, dtype, seed: int) -> torch.Tensor:
    """Rows made to trip an argmax: plain random; few distinct values (ties everywhere); the maximum twice, the
    later copy in an earlier lane or set; the maximum only in the tail; all -inf; +inf twice; -inf around it."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(n, generator=g), torch.randint(0, 3, (n,), generator=g).float(),
            torch.randint(-2, 1, (n,), generator=g).float() * 0.5]
    r = torch.randn(n, generator=g)
    r[n // 2] = r[n - 1] = 10.0  # the same maximum twice: the first index wins
    rows.append(r)
    r = torch.randn(n, generator=g)
    r[n - 1] = 9.0
    rows.append(r)
    rows.append(torch.full((n,), float("-inf")))
    r = torch.randn(n, generator=g)
    r[(3 * n) // 4] = r[n // 3] = float("inf")
    rows.append(r)
    r = torch.full((n,), float("-inf"))
    r[n // 5] = -1e30
    rows.append(r)
    return torch.stack(rows).to(dtype)


LENGTHS = [1, 2, 7, 31, 32, 33, 63, 64, 65, 95, 127, 128, 129, 191, 1000, 49152]


def check_lengths():
    for dtype in (torch.float32, torch.bfloat16):
        for n in LENGTHS:
            test_equals_torch_argmax(dtype, n)
        test_rows_holding_a_nan_are_left_to_torch(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", LENGTHS)
def test_equals_torch_argmax(dtype, n):
    """Around both kernels' steps: 32 logits per pass with AVX2, 64 with AVX-512 (from 64 logits on)."""
    x = _rows(n, dtype, seed=n)
    assert torch.equal(K.argmax_rows(x), x.float().argmax(dim=-1))
    # a strided view is read as its values
    wide = torch.cat([x, x], dim=1)[:, :n]
    assert torch.equal(K.argmax_rows(wide), x.float().argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_holding_a_nan_are_left_to_torch(dtype):
    x = _rows(200, dtype, seed=1)
    x[2, 150] = float("nan")   # in the vector part
    x[4, 199] = float("nan")   # in the tail
    got = K.argmax_rows(x)
    want = x.float().argmax(dim=-1)
    assert got[2] == -1 and got[4] == -1
    keep = torch.ones(len(x), dtype=torch.bool)
    keep[[2, 4]] = False
    assert torch.equal(got[keep], want[keep])


def test_avx2_loop_on_an_avx512_cpu():
    """RTP_LLM_CPU_NO_AVX512=1 runs the AVX2 loop (CPUs without AVX-512): the same checks, in a process of its own
    (the choice is made once per process). On a CPU without AVX-512 it is the loop the tests above ran."""
    env = dict(os.environ, RTP_LLM_CPU_NO_AVX512="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", "from tests.device.cpu.test_argmax_rows import check_lengths; "
                           "check_lengths()"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_greedy_steps_of_a_bf16_head_are_torch_argmax_of_its_logits():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(3001, 64, generator=g).to(torch.bfloat16)
    head = Linear(64, 3001, False, torch.bfloat16, "cpu", tied=torch.nn.Parameter(w, requires_grad=False))
    h = torch.randn(6, 64, generator=g).to(torch.bfloat16)
    h[3, 7] = float("nan")  # its logits are all NaN: torch.argmax names the first
    want = head(h).float().argmax(dim=-1)
    assert want[3] == 0
    assert torch.equal(CpuOps().greedy_tokens(h, head), want)


def test_bad_arguments_are_named():
    with pytest.raises(RuntimeError, match="argmax_rows: logits must be"):
        K.argmax_rows(torch.randn(5))
    with pytest.raises(RuntimeError, match="argmax_rows: logits must be"):
        K.argmax_rows(torch.randn(3, 0))
    with pytest.raises(RuntimeError, match="argmax_rows: float32 or bfloat16"):
        K.argmax_rows(torch.randn(3, 4).half())
