"""GGUF blocks for kernel tests: made by the gguf package's quantizer from random weights, or byte by byte (random
quants and packed scales, hand-picked fp16 scales: zero, subnormal, huge, negative) where it has no quantizer
(the k-quants) or to reach values it would never write."""

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

FORMATS = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]  # gguf's quantizer writes these
K_QUANTS = ["Q4_K", "Q5_K", "Q6_K"]  # these only byte by byte (gguf has no quantizer for them)
ALL = FORMATS + K_QUANTS


def block_bytes(fmt):
    return gguf.GGML_QUANT_SIZES[getattr(T, fmt)][1]


def block_elements(fmt):
    return gguf.GGML_QUANT_SIZES[getattr(T, fmt)][0]


def as_blocks(raw: np.ndarray, fmt: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(raw)).view(raw.shape[0], -1, block_bytes(fmt))


def bytewise(fmt, n, k, seed=0, extreme=True):
    """Random blocks (every quant, nibble and packed 6-bit scale at random). Their fp16 scales (and mins) are
    hand-picked: zero, subnormal, tiny, huge, negative; or, with extreme=False, of a realistic size."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // block_elements(fmt), block_bytes(fmt)), dtype=np.uint8)
    if extreme:
        scales = np.array([0.0, 6e-8, 1e-4, 0.5, -2.0, 1000.0, 65504.0, -65504.0], dtype=np.float16)
    else:
        scales = (rng.uniform(0.002, 0.02, 64) * rng.choice([-1, 1], 64)).astype(np.float16)
    offsets = {"Q6_K": [208], "Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2]}.get(fmt, [0])
    for o in offsets:
        raw[:, o:o + 2] = scales[rng.integers(0, len(scales), len(raw))].view(np.uint8).reshape(-1, 2)
    return raw.reshape(n, -1)


def quantized(fmt, n, k, seed=0):
    if fmt in K_QUANTS:
        return bytewise(fmt, n, k, seed, extreme=False)
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    return quants.quantize(w, getattr(T, fmt))
