"""GGUF blocks as integers with a scale and offset per 32 columns (rtp_llm/models/int_groups.py), the form the NPU's
weight-only quantized matmul takes, against gguf's own dequantize on blocks made by its quantizer and byte-wise
(k-quants, extreme scales, zero scales); the rounding to the device dtype within the README's stated bound; and the
per-channel int8 of --quantization int8."""

import gguf
import numpy as np
import pytest
import torch

from rtp_llm.models.int_groups import FORMATS, GROUP, int_groups
from rtp_llm.models.quantized import QuantizedWeight

EXACT = ("Q8_0", "Q4_0", "Q5_0")  # no offset: (q) * d is the file's value


def random_blocks(fmt, rows, cols, seed):
    """Byte-wise random blocks with fp16 scales (and mins) over several magnitudes, some exactly 0."""
    qtype = getattr(gguf.GGMLQuantizationType, fmt)
    per, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows * cols // per, nbytes), dtype=np.uint8)
    scales = np.array([0.0, 1e-6, 3e-4, 0.01, 0.5, -0.02, 7.0], dtype=np.float16)
    pick = lambda: scales[rng.integers(0, len(scales), len(raw))].view(np.uint8).reshape(-1, 2)  # noqa: E731
    raw[:, 0:2] = pick()
    if fmt in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
        raw[:, 2:4] = pick()
    return raw.reshape(rows, cols // per, nbytes)


def quantizer_blocks(fmt, rows, cols, seed):
    qtype = getattr(gguf.GGMLQuantizationType, fmt)
    data = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.1
    per, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    return gguf.quants.quantize(data, qtype).reshape(rows, cols // per, nbytes)


def reference(blocks, fmt):
    qtype = getattr(gguf.GGMLQuantizationType, fmt)
    return torch.from_numpy(gguf.quants.dequantize(blocks.reshape(blocks.shape[0], -1), qtype)).double()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("source", ["random", "quantizer"])
def test_integers_scale_and_offset_give_ggufs_values(fmt, source):
    if source == "quantizer" and fmt.endswith("_K"):
        pytest.skip("gguf's quantizer does not write k-quants (the random blocks cover them)")
    make = random_blocks if source == "random" else quantizer_blocks
    blocks = make(fmt, 13, 512, seed=FORMATS.index(fmt))
    g = int_groups(blocks, fmt)
    ref = reference(blocks, fmt)
    assert g.q.dtype == torch.int8 and tuple(g.q.shape) == (13, 512)
    assert tuple(g.scale.shape) == (13, 512 // GROUP) and g.scale.dtype == torch.float32
    lo, hi = (-8, 7) if g.bits == 4 else (-128, 127)
    assert lo <= int(g.q.min()) and int(g.q.max()) <= hi
    assert g.bits == (4 if fmt in ("Q4_0", "Q4_1", "Q4_K") else 8)
    got = g.dequantize()
    if fmt in EXACT:
        assert g.offset is None
        assert torch.equal(got, ref)
    else:  # the offset m / scale is held in float32: off by its rounding only
        off = g.offset.double().repeat_interleave(GROUP, 1) * g.scale.double().repeat_interleave(GROUP, 1)
        assert ((got - ref).abs() <= 2.0 ** -22 * (ref.abs() + off.abs()) + 1e-30).all()


def test_a_zero_scale_block_holds_its_minimum_everywhere():
    blocks = quantizer_blocks("Q4_1", 2, 64, seed=3)
    blocks[0, 1, 0:2] = np.array([0], dtype=np.float16).view(np.uint8)          # d = 0
    blocks[0, 1, 2:4] = np.array([-0.25], dtype=np.float16).view(np.uint8)      # m
    got = int_groups(blocks, "Q4_1").dequantize()
    assert torch.equal(got[0, 32:64], torch.full((32,), -0.25, dtype=torch.float64))
    assert torch.equal(reference(blocks, "Q4_1")[0, 32:64], got[0, 32:64])


def test_q6_k_does_not_map():
    assert int_groups(np.zeros((1, 1, 210), dtype=np.uint8), "Q6_K") is None


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounding_to_the_device_dtype_stays_within_the_stated_bound(fmt, dtype):
    """The README's bound for the NPU: scale and offset rounded to the model's dtype, (q + offset) * scale computed
    and rounded once: |w' - w| <= 2u (|w| + |offset * scale|) (1 + 4u) + (|q + offset| + 1) * sub / 2, u the dtype's
    unit roundoff, sub its smallest subnormal (float16 scales can be subnormal). Groups whose offset or scale does
    not fit the dtype (float16 overflow of m / d) are what the NPU keeps dense (test_npu_quantized). The exactly
    mapped formats in float16 give the dequantized weight rounded to float16 bit for bit (the dense model's)."""
    blocks = random_blocks(fmt, 16, 512, seed=7)
    g = int_groups(blocks, fmt)
    fits = torch.isfinite(g.scale.to(dtype))
    if g.offset is not None:
        fits &= torch.isfinite(g.offset.to(dtype))
    fits = fits.repeat_interleave(GROUP, 1)
    s = g.scale.to(dtype).float().repeat_interleave(GROUP, 1)
    o = 0 if g.offset is None else g.offset.to(dtype).float().repeat_interleave(GROUP, 1)
    device_w = ((g.q.float() + o) * s).to(dtype).double()
    exact = reference(blocks, fmt)
    info = torch.finfo(dtype)
    u, sub = info.eps / 2, info.smallest_normal * info.eps
    o64 = 0 if g.offset is None else g.offset.double().repeat_interleave(GROUP, 1)
    bound = (2 * u * (exact.abs() + (o64 * g.scale.double().repeat_interleave(GROUP, 1)).abs()) * (1 + 4 * u)
             + ((g.q.double() + o64).abs() + 1) * sub / 2)
    assert fits.float().mean() > 0.5
    assert ((device_w - exact).abs() <= bound)[fits].all()
    if fmt in EXACT and dtype == torch.float16:
        assert torch.equal(device_w, exact.to(torch.float16).double())


def test_per_channel_int8():
    w = torch.randn(24, 96) * torch.logspace(-3, 1, 24).unsqueeze(1)
    w[3] = 0
    q = QuantizedWeight.per_channel_int8(w)
    assert q.format == "Q8_0" and q.shape == (24, 96) and q.nbytes == 24 * 3 * 34
    values = q.blocks[:, :, 2:].contiguous().view(torch.int8).reshape(24, 96).float()
    scales = q.blocks[:, :, 0:2].contiguous().view(torch.float16).float()  # [24, 3, 1]
    assert (scales == scales[:, :1]).all()                                 # one scale per row
    assert values.abs().max() <= 127 and (values.abs().amax(1)[torch.arange(24) != 3] >= 126).all()
    deq = torch.from_numpy(gguf.quants.dequantize(q.blocks.reshape(24, -1).numpy(), gguf.GGMLQuantizationType.Q8_0))
    assert torch.equal(deq[3], torch.zeros(96))
    step = scales[:, 0]                                                    # round to nearest: within half a step
    assert ((deq - w).abs() <= step * 0.5 + 1e-6 * w.abs()).all()
    assert QuantizedWeight.per_channel_int8(torch.randn(4, 40)) is None    # K not a multiple of 32
