"""GGUF blocks rewritten as integers with a scale and an offset per 32 columns, w = (q + offset) * scale: the form
weight-only quantized matmuls take (torch_npu.npu_weight_quant_batchmatmul's ANTIQUANT(w) = (w + antiquant_offset)
* antiquant_scale, per-group, group size a multiple of 32).

Q8_0, Q4_0 and Q5_0 map exactly (offset none, scale = the block's fp16 d). Q4_1 / Q5_1 (d*q + m) and the k-quants
Q4_K / Q5_K ((d*sc)*q - dmin*m per 32-element sub-block) need offset = m / scale, which the device rounds to its
dtype (README, Ascend: the bound). Q6_K's sub-blocks are 16 elements, below the smallest group (32): not mapped.
A block whose scale is 0 holds one value m everywhere: written as q = 0, offset = 1, scale = m.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32
FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K")


@dataclass
class IntGroups:
    q: torch.Tensor                 # int8 [N, K]
    scale: torch.Tensor             # float32 [N, K / GROUP]
    offset: torch.Tensor | None     # float32 [N, K / GROUP], None where the format has none
    bits: int                       # 4: every q in [-8, 7] (int4-packable); 8: int8

    def dequantize(self) -> torch.Tensor:
        """float64 (q + offset) * scale: the exact value the integers and the float32 scale / offset stand for."""
        s = self.scale.double().repeat_interleave(GROUP, dim=1)
        o = 0 if self.offset is None else self.offset.double().repeat_interleave(GROUP, dim=1)
        return (self.q.double() + o) * s


def _half(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte `at` of every block, as float32 (exact). b: uint8 [N, nb, bytes]."""
    return np.ascontiguousarray(b[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 values: element j is byte j's low nibble, element j + 16 its high nibble."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int16)


def _fifth_bits(b: np.ndarray, at: int) -> np.ndarray:
    """Q5_0 / Q5_1: bit j of the little-endian uint32 at `at` is element j's fifth bit."""
    qh = np.ascontiguousarray(b[..., at:at + 4]).view("<u4")[..., 0]
    return ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16) << 4


def _k_scales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the 8 six-bit scales and mins of each block's 12 packed bytes -> two int [N, nb, 8]."""
    s = sc12.astype(np.int16)
    lo_sc, lo_m = s[..., 0:4] & 0x3F, s[..., 4:8] & 0x3F
    hi_sc = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 2) & 0x30)
    hi_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 2) & 0x30)
    return np.concatenate([lo_sc, hi_sc], -1), np.concatenate([lo_m, hi_m], -1)


def _k_values(b: np.ndarray, fmt: str) -> np.ndarray:
    """Q4_K / Q5_K quants, int [N, nb, 8, 32]: sub-block s takes nibble s % 2 of bytes 32 * (s // 2) ...; Q5_K adds
    bit s of qh[i] as the fifth bit."""
    qs = b[..., 48:176] if fmt == "Q5_K" else b[..., 16:144]
    chunks = qs.reshape(*qs.shape[:-1], 4, 32).astype(np.int16)
    vals = np.stack([chunks & 0x0F, chunks >> 4], axis=-2).reshape(*qs.shape[:-1], 8, 32)
    if fmt == "Q5_K":
        qh = b[..., 16:48].astype(np.int16)
        vals = vals | (((qh[..., None, :] >> np.arange(8, dtype=np.int16)[:, None]) & 1) << 4)
    return vals


def _with_offset(vals, scale, minimum, centre):
    """w = scale * vals + minimum as (q + offset) * scale with q = vals - centre; blocks of scale 0 hold `minimum`."""
    zero = scale == 0
    safe = np.where(zero, 1.0, scale.astype(np.float64))
    offset = np.where(zero, 1.0, minimum / safe + centre)
    q = np.where(zero[..., None], 0, vals - centre)
    return q, np.where(zero, minimum, scale), offset


def int_groups(blocks: np.ndarray | torch.Tensor, fmt: str) -> IntGroups | None:
    """blocks: uint8 [N, nb, block bytes] of `fmt`; None for a format not in FORMATS."""
    if fmt not in FORMATS:
        return None
    b = blocks.numpy() if isinstance(blocks, torch.Tensor) else np.asarray(blocks)
    rows = b.shape[0]
    offset = None
    if fmt == "Q8_0":
        q, scale, bits = b[..., 2:34].view(np.int8).astype(np.int16), _half(b, 0), 8
    elif fmt == "Q4_0":
        q, scale, bits = _nibbles(b[..., 2:18]) - 8, _half(b, 0), 4
    elif fmt == "Q5_0":
        q, scale, bits = (_nibbles(b[..., 6:22]) | _fifth_bits(b, 2)) - 16, _half(b, 0), 8
    elif fmt in ("Q4_1", "Q5_1"):
        vals = _nibbles(b[..., 4:20]) if fmt == "Q4_1" else _nibbles(b[..., 8:24]) | _fifth_bits(b, 4)
        centre, bits = (8, 4) if fmt == "Q4_1" else (16, 8)
        q, scale, offset = _with_offset(vals, _half(b, 0), _half(b, 2).astype(np.float64), centre)
    else:  # Q4_K, Q5_K: 8 sub-blocks of 32 per block, each its own group
        sc, m = _k_scales(b[..., 4:16])
        scale = _half(b, 0)[..., None] * sc.astype(np.float32)            # float32, as gguf's d * sc
        minimum = -(_half(b, 2)[..., None] * m.astype(np.float32)).astype(np.float64)
        centre, bits = (8, 4) if fmt == "Q4_K" else (16, 8)
        q, scale, offset = _with_offset(_k_values(b, fmt), scale, minimum, centre)
    as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(rows, -1))  # noqa: E731
    return IntGroups(q=torch.from_numpy(np.ascontiguousarray(q, dtype=np.int8).reshape(rows, -1)),
                     scale=as_tensor(scale), offset=None if offset is None else as_tensor(offset), bits=bits)
