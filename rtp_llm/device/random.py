"""Counter-based random numbers: uniform(seed, step, token index) from integer hashing.

Each row's noise depends only on its request's seed and step, never on the batch it shares, so a
seeded request gives the same tokens whatever runs beside it. The hash is plain int64 tensor
arithmetic, so CPU, CUDA and NPU draw bit-identical numbers.
"""

from __future__ import annotations

import torch

_M1 = -4658895280553007687  # 0xbf58476d1ce4e5b9 as int64
_M2 = -7723592293110705685  # 0x94d049bb133111eb as int64
_GOLDEN = -7046029254386353131  # 0x9e3779b97f4a7c15 as int64
_STEP = 0x632BE59BD9B4E019


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def uniform(seeds: torch.Tensor, steps: torch.Tensor, n: int) -> torch.Tensor:
    """[R, n] float32 in (0, 1): row r from (seeds[r], steps[r]), column i from token index i."""
    dev = seeds.device
    base = _mix(seeds.to(torch.int64) * _GOLDEN + steps.to(torch.int64) * _STEP)
    idx = torch.arange(n, dtype=torch.int64, device=dev) * _GOLDEN
    x = _mix(base[:, None] + idx[None, :])
    return ((_shr(x, 40) & 0xFFFFFF).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
