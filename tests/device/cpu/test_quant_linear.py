"""torch.ops.rtp_llm.quant_pack / quant_linear / quant_dequantize / quant_packed_rows: GGUF block weights,
repacked at load (16 rows interleaved per block, the same bytes), multiplied without a float copy.

References are the `gguf` package's own: its quantizer makes the blocks, its dequantize gives each weight's
value, and the product is taken in float64. Blocks are also made byte by byte (random nibbles and quants, scales
that are zero, subnormal, huge, negative), which the quantizer would never write. Every row's result must be
bit-identical whatever else is in the batch, and the same on a CPU without AVX-512."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from rtp_llm._native import ops  # noqa: E402
from rtp_llm.device.cpu.linear import gated_rows  # noqa: E402
from tests.models.gguf_blocks import (ALL, FORMATS, K_QUANTS, as_blocks, block_bytes,  # noqa: E402,F401
                                      block_elements, bytewise, quantized)

R = ops()


def qlin(x, blocks, bias=None):
    """quant_linear on the blocks as the CPU planner holds them (quant_pack's layout)."""
    return R.quant_linear(x, R.quant_pack([blocks]), bias, blocks.shape[0])


def reference(x: torch.Tensor, raw: np.ndarray, fmt: str, bias=None):
    w = quants.dequantize(raw, getattr(T, fmt)).astype(np.float64)
    y = x.double() @ torch.from_numpy(w).T
    return y if bias is None else y + bias.double()


def tolerance(x, raw, fmt):
    w = np.abs(quants.dequantize(raw, getattr(T, fmt)).astype(np.float64))
    # float32 sums of K products: a few units in the last place of the sum of magnitudes
    return (x.double().abs() @ torch.from_numpy(w).T) * (x.shape[1] * 2.0 ** -23) + 1e-30


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("make", [quantized, bytewise])
def test_dequantize_is_gguf_bit_for_bit(fmt, make):
    raw = make(fmt, 37, 256)
    ours = R.quant_dequantize(as_blocks(raw, fmt)).numpy()
    theirs = quants.dequantize(raw, getattr(T, fmt))
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))  # bits, so -0.0 and NaN count


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("n,k", [(37, 256), (8, 512), (129, 768), (1, 1536)])
def test_matches_the_dequantized_matrix(fmt, n, k):
    raw = quantized(fmt, n, k, seed=n + k)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(k))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n))
    for b in (None, bias):
        y = qlin(x, as_blocks(raw, fmt), b)
        assert y.dtype == torch.float32 and y.shape == (11, n)
        err = (y.double() - reference(x, raw, fmt, b)).abs()
        assert bool((err <= tolerance(x, raw, fmt) + 1e-6).all()), err.max()


@pytest.mark.parametrize("fmt", ALL)
def test_bf16_activations_widen_exactly_and_the_result_rounds_once(fmt):
    """A bf16 model's rows: the bf16 activations widened (exactly) to float32 meet the same weights and sums as a
    float32 row, and the result (bias included) is rounded to bf16 once: within half a bf16 unit of the float64
    product of the same values, bit for bit the float32 kernel's result rounded, whatever the batch."""
    raw = quantized(fmt, 45, 512, seed=3)
    blocks = as_blocks(raw, fmt)
    x = torch.randn(37, 512, generator=torch.Generator().manual_seed(4)).bfloat16()
    bias = torch.randn(45, generator=torch.Generator().manual_seed(5)).bfloat16()
    y = qlin(x, blocks, bias)
    assert y.dtype == torch.bfloat16 and y.shape == (37, 45)
    ref = reference(x.float(), raw, fmt, bias.float())
    half_unit = ref.abs() * 2.0 ** -8  # 8 significant bits
    assert bool(((y.double() - ref).abs() <= half_unit + tolerance(x.float(), raw, fmt) + 1e-6).all())
    assert torch.equal(y, qlin(x.float(), blocks, bias.float()).bfloat16())
    for m in (1, 2, 5):
        assert torch.equal(qlin(x[:m], blocks, bias), y[:m])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", [32, 96])
def test_short_rows_of_32_element_blocks(fmt, k):
    raw = quantized(fmt, 13, k, seed=k)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(k))
    err = (qlin(x, as_blocks(raw, fmt)).double() - reference(x, raw, fmt)).abs()
    assert bool((err <= tolerance(x, raw, fmt) + 1e-6).all())


@pytest.mark.parametrize("fmt", ALL)
def test_extreme_blocks_match_the_reference(fmt):
    raw = bytewise(fmt, 45, 256, seed=3)
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(1))
    y = qlin(x, as_blocks(raw, fmt)).double()
    ref = reference(x, raw, fmt)
    finite = torch.isfinite(ref)
    assert bool(finite.any())
    assert bool(((y - ref).abs()[finite] <= tolerance(x, raw, fmt)[finite] * 4).all())


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("k", [256, 1792])
def test_a_rows_result_does_not_depend_on_the_batch(fmt, k):
    raw = quantized(fmt, 45, k, seed=7)
    blocks = as_blocks(raw, fmt)
    packed = R.quant_pack([blocks])
    x = torch.randn(2048, k, generator=torch.Generator().manual_seed(2))
    full = R.quant_linear(x, packed, None, 45)
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 257):
        assert torch.equal(R.quant_linear(x[:m], packed, None, 45), full[:m]), m
    for r in (0, 1, 5, 1000, 2047):  # one row alone, at the front of a batch and in the middle of another
        assert torch.equal(R.quant_linear(x[r:r + 1], packed, None, 45), full[r:r + 1])
        assert torch.equal(R.quant_linear(x[r:r + 6], packed, None, 45)[0], full[r])


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("make", [quantized, bytewise])
def test_the_dequantized_models_fp32_panels_bit_for_bit(fmt, make):
    """The product is the fp32 panel kernel's on the dequantized matrix, bits included (NaN and inf where the
    extreme blocks make them), at every row count: the few-row path that decodes in registers and the panel path
    alike, so serving a GGUF as stored or dequantized gives the same logits."""
    n, k = 100, 512
    raw = make(fmt, n, k, seed=11)
    blocks = as_blocks(raw, fmt)
    packed, panels = R.quant_pack([blocks]), R.pack_panels(R.quant_dequantize(blocks))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(12))
    for m in (1, 2, 3, 4, 5, 9, 33, 200):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        ours, theirs = R.quant_linear(x, packed, bias, n), R.panel_linear(x, panels, bias, n)
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32)), (m, (ours - theirs).abs().max())


def _gated(blocks, inter):
    """gate_up's blocks packed in gated panels' row order, as the CPU planner packs a float32 run's gate_up."""
    parts, order = gated_rows([blocks[:inter], blocks[inter:]], inter)
    return R.quant_pack(parts), order


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("make", [quantized, bytewise])
@pytest.mark.parametrize("inter", [96, 37])
def test_gated_gate_up_is_the_dequantized_gated_panels_bit_for_bit(fmt, make, inter):
    """quant_linear_silu on blocks in gated panels' order (24 gate and 24 up rows per panel, zero rows past I):
    silu(gate) * up bit for bit as the fp32 gated panels of the dequantized matrix give it (pack_gated_panels:
    the SiLU in the tiles' epilogue), and as silu_and_mul after quant_linear on the blocks in their own order,
    at every row count: the few-row path (registers, then the activation) and the panel path (the epilogue). An
    activation width that is no multiple of 24 or 8 pads the last panel and takes activation.cc's scalar tail."""
    k = 512
    raw = make(fmt, 2 * inter, k, seed=inter)
    blocks = as_blocks(raw, fmt)
    gated, _ = _gated(blocks, inter)
    plain = R.quant_pack([blocks])
    bias = torch.randn(2 * inter, generator=torch.Generator().manual_seed(3))
    x = torch.randn(203, k, generator=torch.Generator().manual_seed(inter))
    dense = R.pack_gated_panels(R.quant_dequantize(blocks)) if R.cpu_isa() == "avx512" else None
    for b in (None, bias):
        full = R.quant_linear_silu(x, gated, b, inter)
        assert full.shape == (203, inter) and full.dtype == torch.float32
        unfused = R.silu_and_mul(R.quant_linear(x, plain, b, 2 * inter))
        assert torch.equal(full.view(torch.int32), unfused.view(torch.int32))
        if dense is not None:
            assert torch.equal(full.view(torch.int32), R.panel_linear_silu(x, dense, b, inter).view(torch.int32))
        for m in (1, 2, 4, 5, 8, 9, 33):  # linear_silu is the call the layers make; the same rows' bits
            assert torch.equal(R.linear_silu(x[:m], gated, b, inter).view(torch.int32), full[:m].view(torch.int32))
    # bf16 rows (bf16 runs keep gate_up unfused, but the op still answers): silu_and_mul of the rounded product
    xb = x[:9].bfloat16()
    assert torch.equal(R.quant_linear_silu(xb, gated, bias.bfloat16(), inter),
                       R.silu_and_mul(R.quant_linear(xb, plain, bias.bfloat16(), 2 * inter)))
    with pytest.raises(RuntimeError, match="groups of 16"):
        R.quant_linear_silu(x, gated, None, inter + 24)
    with pytest.raises(RuntimeError, match="bias must be"):
        R.quant_linear_silu(x, gated, torch.zeros(inter), inter)


def test_gated_rows_keep_every_rows_dequantized_values():
    """A weight packed in gated order still answers rows() and dequantize() in its own order (row_order)."""
    from rtp_llm.models.quantized import QuantizedWeight

    inter = 37
    raw = bytewise("Q4_K", 2 * inter, 512, seed=21)
    q = QuantizedWeight(as_blocks(raw, "Q4_K").numpy(), "Q4_K")
    dense = R.quant_dequantize(as_blocks(raw, "Q4_K"))
    packed, order = _gated(as_blocks(raw, "Q4_K"), inter)
    q.repacked(packed, order)
    assert torch.equal(q.dequantize().view(torch.int32), dense.view(torch.int32))
    ids = torch.tensor([[73, 0, 36], [37, 24, 60]])
    assert torch.equal(q.rows(ids).view(torch.int32), dense[ids].view(torch.int32))


@pytest.mark.parametrize("fmt", ALL)
def test_packed_rows_are_the_dequantized_rows_and_as_many_bytes(fmt):
    raw = bytewise(fmt, 37, 512, seed=13)  # 37 rows: the last group of 16 is partly padding
    blocks = as_blocks(raw, fmt)
    packed = R.quant_pack([blocks])
    dense = R.quant_dequantize(blocks)
    ids = torch.tensor([[36, 0, 17], [15, 16, 36]])
    rows = R.quant_packed_rows(packed, ids, 37)
    assert rows.shape == (2, 3, 512)
    assert torch.equal(rows.view(torch.int32), dense[ids].view(torch.int32))
    # the same bytes per row, but the k-quants' packed 6-bit scales kept as bytes: +4 bytes per 256 weights, and
    # Q4_1 with a block whose slot constants are inexact packed as Q5_1 (test_q4_1_slot_words_or_q5_1)
    per_row = packed.numel() / (packed.shape[0] * 16)
    grown = 1.03 if fmt in K_QUANTS else (1.2 if fmt == "Q4_1" and not q4_1_slots_exact(raw) else 1.0)
    assert per_row <= blocks[0].numel() * grown
    with pytest.raises(RuntimeError, match="out of range"):
        R.quant_packed_rows(packed, torch.tensor([37]), 37)


def q4_1_slots_exact(raw: np.ndarray) -> bool:
    """quant_packed.h's rule, computed here in float64: every block's c = m - d 2^s (s = 4, 8, 12) is exact in
    float32, so the slot words' one-FMA decode gives gguf's value."""
    b = raw.reshape(-1, block_bytes("Q4_1"))
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32).ravel()
    m = b[:, 2:4].copy().view(np.float16).astype(np.float32).ravel()
    ok = np.ones(len(d), dtype=bool)
    for s in (4, 8, 12):
        dp = d * np.float32(2.0 ** s)
        ok &= (m - dp).astype(np.float64) == m.astype(np.float64) - dp.astype(np.float64)
    return bool(ok.all())


def q4_1_exact_extremes(n, k, seed):
    """Random Q4_1 nibbles under extreme (d, min) pairs whose slot constants are all exact."""
    pairs = [(0.0, -65504.0), (6e-8, 0.5), (1e-4, -8.0), (0.5, 65504.0), (-2.0, 1000.0), (1000.0, -2.0),
             (65504.0, -65504.0), (-65504.0, 16.0), (-0.0, 6e-8), (16.0, 0.0)]
    raw = bytewise("Q4_1", n, k, seed).reshape(-1, block_bytes("Q4_1"))
    pick = np.random.default_rng(seed).integers(0, len(pairs), len(raw))
    dm = np.array(pairs, dtype=np.float16)[pick]
    raw[:, 0:4] = dm.view(np.uint8).reshape(-1, 4)
    return raw.reshape(n, -1)


def test_q4_1_slot_words_or_q5_1():
    """Q4_1 is packed in slot words (a nibble or'ed into 1.0f's bits, one FMA with d 2^s and m - d 2^s) where
    every block's constants are exact, at the stored size; a tensor with one block where they are not is packed
    as Q5_1 (zero fifth bits, 1.2x). Either way the weights are gguf's and the product the dequantized matrix's
    fp32 panels' bit for bit, at every row count, for extreme scales and mins too."""
    n, k = 100, 512
    exact = q4_1_exact_extremes(n, k, seed=31)
    inexact = exact.copy().reshape(-1, block_bytes("Q4_1"))
    inexact[777, 0:4] = np.array([1000.0, 1e-4], dtype=np.float16).view(np.uint8)  # m - 4096 d rounds
    inexact = inexact.reshape(n, -1)
    assert q4_1_slots_exact(exact) and not q4_1_slots_exact(inexact)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(32))
    for raw, group_bytes in ((exact, 16 * 20), (inexact, 16 * 24)):
        blocks = as_blocks(raw, "Q4_1")
        packed, dense = R.quant_pack([blocks]), R.quant_dequantize(blocks)
        assert packed.shape == ((n + 15) // 16, k // 32, group_bytes)
        ids = torch.tensor([0, 15, 16, 57, 99])
        assert torch.equal(R.quant_packed_rows(packed, ids, n).view(torch.int32), dense[ids].view(torch.int32))
        for m in (1, 2, 3, 4, 5, 9, 33, 200):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            ours = R.quant_linear(x, packed, bias, n)
            theirs = R.panel_linear(x, R.pack_panels(dense), bias, n)
            assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32)), m
            ref = x.double() @ dense.double().T + bias.double()
            finite = torch.isfinite(ref)
            tol = (x.double().abs() @ dense.double().abs().T) * (k * 2.0 ** -23)
            assert bool(((ours.double() - ref).abs()[finite] <= tol[finite] + 1e-6).all())


def _run_in_process(env_extra, fmt):
    code = f"""
import json, sys, numpy as np, torch
sys.path.insert(0, {os.getcwd()!r})
from tests.models.gguf_blocks import as_blocks, quantized
from rtp_llm._native import ops
R = ops()
raw = quantized({fmt!r}, 29, 512, seed=5)
x = torch.randn(37, 512, generator=torch.Generator().manual_seed(9))
p = R.quant_pack([as_blocks(raw, {fmt!r})])
y = torch.cat([R.quant_linear(x, p, None, 29), R.quant_linear(x[:3], p, None, 29)])
from rtp_llm.device.cpu.linear import gated_rows
b = as_blocks(quantized({fmt!r}, 74, 512, seed=6), {fmt!r})
g = R.quant_pack(gated_rows([b[:37], b[37:]], 37)[0])
y = torch.cat([y.flatten(), R.quant_linear_silu(x, g, None, 37).flatten(), R.quant_linear_silu(x[:2], g, None, 37).flatten()])
print(json.dumps({{"isa": R.cpu_isa(), "bits": y.view(torch.int32).flatten().tolist()}}))
"""
    env = dict(os.environ, **env_extra)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt", ALL)
def test_same_bits_without_avx512(fmt):
    native = _run_in_process({}, fmt)
    portable = _run_in_process({"RTP_LLM_CPU_NO_AVX512": "1"}, fmt)
    assert portable["isa"] != "avx512"
    if native["isa"] != "avx512":
        pytest.skip("this CPU has no AVX-512: both runs took the portable kernel")
    assert native["bits"] == portable["bits"]


def test_bad_blocks_are_refused_with_the_formats_named():
    with pytest.raises(RuntimeError, match="Q8_0 34, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24, Q4_K 144"):
        R.quant_pack([torch.zeros(3, 1, 19, dtype=torch.uint8)])
    with pytest.raises(RuntimeError, match="Q8_0 544, Q4_0 288, Q4_1 320"):  # stored blocks, not packed
        R.quant_linear(torch.randn(2, 32), torch.zeros(3, 1, 34, dtype=torch.uint8), None, 3)
    packed = R.quant_pack([torch.zeros(3, 1, 34, dtype=torch.uint8)])
    with pytest.raises(RuntimeError, match="columns"):
        R.quant_linear(torch.randn(2, 64), packed, None, 3)
    with pytest.raises(RuntimeError, match="groups of 16"):
        R.quant_linear(torch.randn(2, 32), packed, None, 17)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        R.quant_linear(torch.randn(2, 32, dtype=torch.float16), packed, None, 3)


SCALE_FIELDS = {"Q6_K": [208], "Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2]}


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("bits", [0x7C00, 0xFC00, 0x7E00])  # +inf, -inf, NaN
def test_blocks_with_a_non_finite_scale_are_refused_at_packing(fmt, bits):
    """No quantizer writes inf or NaN scales: such a file is corrupt, and the kernels' fused decode would give NaN
    where gguf's dequantize gives inf. quant_pack names the row and block instead of serving garbage."""
    k = block_elements(fmt) * 2
    for at in SCALE_FIELDS.get(fmt, [0]):
        raw = bytewise(fmt, 20, k, seed=3, extreme=False)
        blocks = as_blocks(raw, fmt).clone()
        blocks[17, 1, at:at + 2] = torch.tensor([bits & 0xFF, bits >> 8], dtype=torch.uint8)
        with pytest.raises(RuntimeError, match="row 17 block 1 has a non-finite scale"):
            R.quant_pack([blocks])
        # in a later part of a fused projection the row counts on from the earlier parts
        with pytest.raises(RuntimeError, match="row 37 block 1 has a non-finite scale"):
            R.quant_pack([as_blocks(raw, fmt), blocks])
    assert R.quant_pack([as_blocks(bytewise(fmt, 20, k, seed=3, extreme=False), fmt)]).numel() > 0
