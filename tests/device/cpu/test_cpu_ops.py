"""The CPU op set: packed linear layers (panels for float32 on AVX-512, oneDNN's blocked layout otherwise)
give the same products as a float64 reference on every row count (1 row to a prefill's thousands, 3-D
inputs, biases) and release the plain weight copies; the panel and GEMV kernels against float64 and
independent of the rows beside each row; the fused
RMSNorm / add+RMSNorm / RoPE kernels equal the reference functions (non-contiguous inputs included); and
whole models on the CPU op set give the logits of the plain torch op set (which tests/models holds to
transformers)."""

import copy

import pytest
import torch

from rtp_llm.device.attention import TorchRefAttention
from rtp_llm.device.cpu.attention import CpuAttention
from rtp_llm.device.cpu.linear import onednn_available, onednn_bf16
from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.device.torch_ops import TorchOps
from rtp_llm.layers.linear import Linear
from rtp_llm.models.registry import load_model
from tests.models.tiny_checkpoints import make_checkpoint

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


def _linear(in_f, out_f, bias=False, dtype=torch.float32, feeds_silu=False):
    """A linear layer with random weights (and bias), as the model builds them."""
    lin = Linear(in_f, out_f, bias, dtype, "cpu", feeds_silu=feeds_silu)
    lin.weight.data = torch.randn(out_f, in_f).to(dtype)
    if bias:
        lin.bias.data = torch.randn(out_f).to(dtype)
    return lin


def _tied_head(vocab, in_f):
    return Linear(in_f, vocab, False, torch.float32, "cpu",
                  tied=torch.nn.Parameter(torch.randn(vocab, in_f), requires_grad=False))


def check_gemv_kernel(expected_isa: str) -> None:
    """The GEMV kernel this process runs against float64 products (float32 and bf16, biases, shapes with
    tails), and each row's result independent of the other rows in the call (every output summed in the same
    order whatever the row count); then its argument checks."""
    from rtp_llm._native import ops

    assert ops().cpu_isa() == expected_isa
    g = torch.Generator().manual_seed(5)
    for m, n, k in ((1, 960, 576), (2, 49152, 64), (4, 7, 13), (8, 5, 1536), (6, 50, 1536), (8, 77, 37),
                    (11, 100, 576), (16, 29, 1550)):
        x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        ref = x.double() @ w.double().t()
        out = ops().gemv(x, w)
        torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(ops().gemv(x, w, b).double(), ref + b.double(), atol=1e-4, rtol=1e-5)
        xb, wb = x.bfloat16(), w.bfloat16()  # bf16 products are exact in fp32: one rounding at the end
        out_b = ops().gemv(xb, wb)
        ref = xb.double() @ wb.double().t()
        assert out_b.dtype == torch.bfloat16
        assert ((out_b.double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item() < 2 ** -7
        for rows in range(1, m):
            assert torch.equal(ops().gemv(x[-rows:], w), out[-rows:])
            assert torch.equal(ops().gemv(xb[:rows], wb), out_b[:rows])
    with pytest.raises(RuntimeError, match="at most 16 rows"):
        ops().gemv(torch.zeros(17, 4), torch.zeros(3, 4))
    with pytest.raises(RuntimeError, match="both be float32 or both bfloat16"):
        ops().gemv(torch.zeros(1, 4), torch.zeros(3, 4).bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_panel_kernel_matches_float64_and_each_row_is_independent_of_the_others(dtype):
    """The panel kernel against float64 products: output widths that are not a multiple of the 48-column
    panel (zero-padded, masked stores), odd K, biases, every row-block size 1-8 and row counts across the
    192-row chunks of a prefill. Every output is one chain of fused adds over k (bf16: exact pair products
    added high then low, then one rounding to bf16), so each row's result is bit-identical whatever rows
    share the call and however many threads split the panels."""
    ops = CpuOps()
    if dtype not in ops.panel_dtypes:
        pytest.skip(f"no {dtype} panels on this CPU: CpuOps uses oneDNN's packed GEMM "
                    "(test_packed_linear_matches_float64)")
    k_ops = ops.kernels
    g = torch.Generator().manual_seed(7)
    # float32: the float64 result to 1e-5; bf16: one rounding of the output (2^-8 relative) on top of fp32 sums
    tol = dict(atol=1e-4, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=2 ** -7)
    # K % 32 == 0 with 1-16 rows, a second 16-row block cut short (20), a lone last block (33, 70) and a row
    # chunk's tail (200 x 128): every path of the AMX tiles where the CPU has them
    for m, n, k in ((1, 960, 576), (3, 7, 13), (8, 48, 1536), (17, 50, 37), (20, 50, 96), (33, 97, 576),
                    (70, 576, 64), (200, 130, 100), (200, 130, 128), (1, 49152, 64)):
        x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((m, k), (n, k), (n,)))
        panels = k_ops.pack_panels(w)
        steps = k if dtype == torch.float32 else (k + 1) // 2
        assert panels.shape == ((n + 47) // 48, steps, 48)
        out = k_ops.panel_linear(x, panels, None, n)
        assert out.dtype == dtype
        ref = x.double() @ w.double().t()
        torch.testing.assert_close(out.double(), ref, **tol)
        with_bias = k_ops.panel_linear(x, panels, b, n)
        torch.testing.assert_close(with_bias.double(), ref + b.double(), **tol)
        for rows in sorted({1, 2, 5, 9, m // 2, m - 1} - {0}):
            if rows < m:
                assert torch.equal(k_ops.panel_linear(x[m - rows:], panels, None, n), out[m - rows:])
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert torch.equal(k_ops.panel_linear(x, panels, b, n), with_bias)
        finally:
            torch.set_num_threads(threads)
    w = torch.randn(100, 16).to(dtype)
    with pytest.raises(RuntimeError, match="does not match"):
        k_ops.panel_linear(torch.randn(2, 16).to(dtype), k_ops.pack_panels(w), None, 200)
    with pytest.raises(RuntimeError, match="x has 8 columns"):
        k_ops.panel_linear(torch.randn(2, 8).to(dtype), k_ops.pack_panels(w), None, 100)
    other = torch.bfloat16 if dtype == torch.float32 else torch.float32
    with pytest.raises(RuntimeError, match="in the weight's dtype"):
        k_ops.panel_linear(torch.randn(2, 16).to(other), k_ops.pack_panels(w), None, 100)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        k_ops.pack_panels(w.half())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_panel_sums_are_one_fused_chain_per_output_on_every_cpu(dtype):
    """The order the panel kernels (AVX-512 and AVX2 alike) sum in, emulated step by step: per output, from zero,
    one fused multiply-add per k in order (bf16: per pair the high product, then the low one, each added exactly and
    rounded once), then + bias, then (bf16) one rounding to nearest even. Bit for bit, so the same weights give the
    same logits on either instruction set. (K = 37: not AMX's whole tile steps.) Every row count the kernels tile
    differently (one row, the two-row lead tile, uneven 6-row tiles, more than one 192-row chunk) gives the same
    bits per row."""
    ops = CpuOps()
    if dtype not in ops.panel_dtypes:
        pytest.skip(f"no {dtype} panels on this CPU")
    g = torch.Generator().manual_seed(13)
    m, n, k = 200, 50, 37
    x, w, b = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype), torch.randn(n)
    acc = torch.zeros(m, n)
    # float64 holds each product exactly; rounding its sum with the accumulator to float64, then float32, is the
    # fused single rounding but at double-rounding ties, which these fixed inputs do not meet
    order = range(k) if dtype == torch.float32 else [i for p in range(0, k, 2) for i in (p + 1, p) if i < k]
    for i in order:
        acc = (acc.double() + x[:, i:i + 1].double() * w[:, i].double()).float()
    want = (acc + b).to(dtype)
    panels = ops.kernels.pack_panels(w)
    for rows in (1, 2, 3, 7, 8, 13, 32, 200):
        assert torch.equal(ops.kernels.panel_linear(x[:rows], panels, b, n), want[:rows]), rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_gated_is_silu_and_mul_of_the_same_columns(dtype):
    """silu_and_mul_gated on gated panels' column order (per block of 24: gate then up, padding after the last) gives
    silu_and_mul's bits on [gate | up]: widths with a scalar tail (not a multiple of 8) and a partial last block,
    saturating and zero inputs (the LoRA path of decoder_layers runs it instead of the SiLU epilogue)."""
    k_ops = CpuOps().kernels
    g = torch.Generator().manual_seed(5)
    for m, inter in ((1, 1536), (3, 37), (4, 24), (2, 100), (5, 7), (1, 1)):
        nat = (torch.randn(m, 2 * inter, generator=g) * 6).to(dtype)
        nat[0, 0], nat[-1, inter - 1] = 90.0, -90.0
        blocks = (inter + 23) // 24
        gated = torch.full((m, blocks, 2, 24), float("nan"), dtype=dtype)  # the padding must not be read into a value
        for i in range(inter):
            gated[:, i // 24, 0, i % 24] = nat[:, i]
            gated[:, i // 24, 1, i % 24] = nat[:, inter + i]
        got = k_ops.silu_and_mul_gated(gated.view(m, blocks * 48), inter)
        assert torch.equal(got, k_ops.silu_and_mul(nat)), (m, inter)
    with pytest.raises(RuntimeError, match="silu_and_mul_gated"):
        k_ops.silu_and_mul_gated(torch.zeros(2, 47, dtype=dtype), 24)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_panels_give_silu_and_mul_of_the_panel_product_bit_for_bit(dtype):
    """panel_linear_silu on pack_gated_panels (24 gate + 24 up rows per panel, the SiLU in the GEMM's
    epilogue) against what it replaces, silu_and_mul(panel_linear(x, pack_panels(w))): identical bits, with
    biases, intermediate widths that fill no whole panel or no whole 8 (the scalar tail of silu_and_mul),
    saturated and zero activations, every row-block size and the 192-row chunks; and against float64."""
    ops = CpuOps()
    if dtype not in ops.gated_dtypes:
        pytest.skip(f"no {dtype} gated panels on this CPU")
    k_ops = ops.kernels
    g = torch.Generator().manual_seed(11)
    for m, inter, k in ((1, 1536, 576), (5, 13, 16), (17, 50, 36), (33, 24, 64), (300, 100, 96), (8, 1, 8)):
        x = (torch.randn(m, k, generator=g) * 3).to(dtype)
        w, b = torch.randn(2 * inter, k, generator=g).to(dtype), torch.randn(2 * inter, generator=g)
        w[0, :] = 0
        w[0, 0] = 60.0 if m > 1 else 0.0  # gate 0: +-huge for rows with x[:, 0] of either sign (exp saturates)
        gated = k_ops.pack_gated_panels(w)
        steps = k if dtype == torch.float32 else (k + 1) // 2
        assert gated.shape == ((inter + 23) // 24, steps, 48)
        for bias in (None, b):
            got = k_ops.panel_linear_silu(x, gated, bias, inter)
            want = k_ops.silu_and_mul(k_ops.panel_linear(x, k_ops.pack_panels(w), bias, 2 * inter))
            assert got.dtype == dtype and got.shape == (m, inter)
            assert torch.equal(got, want), (m, inter, k, bias is None)
            gu = x.double() @ w.double().t() + (0 if bias is None else bias.double())
            ref = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
            # fp32: sums of K products to ~1e-6 of the values' scale; bf16: gate, up, silu and the product
            # each rounded to 8 bits
            scale = ref.abs().max().item()
            tol = (dict(atol=1e-6 * scale, rtol=1e-5) if dtype == torch.float32
                   else dict(atol=1e-2 * scale, rtol=2 ** -5))
            torch.testing.assert_close(got.double(), ref, **tol)
            for rows in sorted({1, 7, m // 2} - {0, m}):
                assert torch.equal(k_ops.panel_linear_silu(x[m - rows:], gated, bias, inter), got[m - rows:])
    w = torch.randn(2 * 30, 16).to(dtype)
    with pytest.raises(RuntimeError, match="pack_gated_panels' .* for intermediate 60 .* got \\[2, "):
        k_ops.panel_linear_silu(torch.randn(2, 16).to(dtype), k_ops.pack_gated_panels(w), None, 60)
    with pytest.raises(RuntimeError, match="bias must be \\[60\\]"):
        k_ops.panel_linear_silu(torch.randn(2, 16).to(dtype), k_ops.pack_gated_panels(w), torch.zeros(30), 30)
    with pytest.raises(RuntimeError, match="\\[2 x intermediate, K\\]"):
        k_ops.pack_gated_panels(torch.randn(7, 16).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prepared_mlp_runs_gated_panels_and_linear_still_means_gate_up(dtype):
    """Without tensor parallelism prepare() packs gate_up as gated panels and mlp() runs linear_silu
    (panel_linear_silu) on them (counted): the same bits as the unfused ops on ordinary panels, pieces or not; linear() on that
    weight still returns [gate | up] with the bias added before rounding, as the ordinary panels do."""
    ops = CpuOps()
    if dtype not in ops.gated_dtypes:
        pytest.skip(f"no {dtype} gated panels on this CPU")
    torch.manual_seed(5)
    gate_up = _linear(80, 2 * 50, bias=True, dtype=dtype, feeds_silu=True)
    down = _linear(50, 80, bias=True, dtype=dtype)
    gate_up.bias.data = b1 = torch.randn(100)  # a float32 bias on bf16 weights: the kernel takes either
    b2 = down.bias.detach().clone()
    w_gu, w_down = gate_up.weight.detach().clone(), down.weight.detach().clone()
    ops.prepare_linears([gate_up, down], _tied_head(1000, 80))
    assert gate_up.kernel.gated and gate_up.weight.numel() == 0
    k_ops = ops.kernels
    h = torch.randn(700, 80).to(dtype)
    calls = []
    real = k_ops.linear_silu

    class Counting:
        def __getattr__(self, name):
            return getattr(k_ops, name)

        def linear_silu(self, *args):
            calls.append(args[0].shape[0])
            return real(*args)

    gate_up.kernel.kernels = Counting()
    ops.MLP_ROWS = 256
    got = ops.mlp(h, gate_up, down)
    assert calls == [256, 256, 188]
    plain_gu, plain_down = k_ops.pack_panels(w_gu), k_ops.pack_panels(w_down)
    want = k_ops.panel_linear(k_ops.silu_and_mul(k_ops.panel_linear(h, plain_gu, b1, 100)), plain_down, b2, 80)
    assert torch.equal(got, want)
    assert torch.equal(gate_up(h[:33]), k_ops.panel_linear(h[:33], plain_gu, b1, 100))
    assert torch.equal(gate_up.kernel(h[:3], None), k_ops.panel_linear(h[:3], plain_gu, None, 100))


def _has_avx512() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return all(f" {f}" in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl"))


def test_gemv_kernel_of_this_cpu():
    check_gemv_kernel("avx512" if _has_avx512() else "avx2")


@pytest.mark.skipif(not _has_avx512(), reason="the AVX2 kernel is the one above on this CPU")
def test_gemv_kernel_avx2_on_an_avx512_cpu():
    """RTP_LLM_CPU_NO_AVX512=1 keeps the AVX2 kernel (what CPUs without AVX-512 run): the same checks, in a
    process of its own (the choice is made once per process)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RTP_LLM_CPU_NO_AVX512="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", "from tests.device.cpu.test_cpu_ops import check_gemv_kernel; "
                           "check_gemv_kernel('avx2')"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("gemv_weights", ["off", "on"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 12, 16, 32, 333, 2048])
def test_packed_linear_matches_float64(rows, gemv_weights):
    """Every row count gives the float64 products, whichever kernel serves it: on AVX-512 the panel kernel
    (its panels the only copy of the weights); otherwise the GEMV kernel on few rows (up to 4 with AVX2) when
    the plain copies are kept, oneDNN's packed GEMM else; with the copies off they are released."""
    torch.manual_seed(rows)
    layer = {n: _linear(80, 96, feeds_silu=n == "gate_up") for n in ("qkv", "o", "gate_up", "down")}
    plain = {n: layer[n].weight.detach().clone() for n in ("qkv", "down")}
    tied = _tied_head(1000, 80)
    head = tied.weight.detach().clone()
    ops = CpuOps(gemv_weights=gemv_weights)
    ops.prepare_linears(list(layer.values()), tied)
    panels = torch.float32 in ops.panel_dtypes
    assert ops.keeps_plain_weights == (gemv_weights == "on" and not panels)
    x, bias = torch.randn(rows, 80), torch.randn(96)
    for name, w in plain.items():
        lin = layer[name]
        # panels, or off: released, the packed copy is the only one; on: the plain copy stays for the GEMV kernel
        assert lin.weight.numel() == (w.numel() if ops.keeps_plain_weights else 0)
        assert lin.kernel.packed.dim() == (3 if panels else 2)
        ref = x.double() @ w.double().t() + bias.double()
        torch.testing.assert_close(lin.kernel(x, bias).double(), ref, atol=1e-4, rtol=1e-5)
        x3 = x.reshape(1, rows, 80)
        torch.testing.assert_close(lin(x3).double(), (x3.double() @ w.double().t()), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(tied(x).double(), x.double() @ head.double().t(), atol=1e-4, rtol=1e-5)
    assert tied.weight.numel() == head.numel()  # the tied embedding keeps its plain copy
    untied = _linear(80, 333)
    head = untied.weight.detach().clone()
    ops = CpuOps(gemv_weights=gemv_weights)
    ops.prepare_linears([_linear(80, 96)], untied)
    torch.testing.assert_close(untied(x).double(), x.double() @ head.double().t(), atol=1e-4, rtol=1e-5)
    # an untied head on panels: released (panels serve every row count), unless the greedy screen's exact
    # recompute reads it; else kept for the GEMV kernel
    screened = untied.kernel.screen is not None
    assert screened == (panels and ops.kernels.cpu_avx512_bf16())
    assert untied.weight.numel() == (0 if panels and not screened else head.numel())


@pytest.mark.parametrize("tokens,heads", [(1, 1), (5, 9), (300, 4)])
def test_fused_norms_and_rotary_equal_the_reference(tokens, heads):
    from rtp_llm.config.model_config import RopeConfig
    from rtp_llm.device.torch_ops import apply_rotary, rms_norm
    from rtp_llm.layers.rotary import RotaryEmbedding

    torch.manual_seed(tokens)
    ops, d = CpuOps(), 64
    qkv = torch.randn(tokens, (heads + 2) * d)  # q and k as the model slices them: non-contiguous views
    q, k = qkv[:, :heads * d].reshape(tokens, heads, d), qkv[:, heads * d:(heads + 1) * d].reshape(tokens, 1, d)
    w, eps = torch.randn(d), 1e-6
    torch.testing.assert_close(ops.rms_norm(q, w, eps), rms_norm(q, w, eps), atol=1e-5, rtol=1e-5)
    x, res, w2 = torch.randn(tokens, 96), torch.randn(tokens, 96), torch.randn(96)
    normed, total = ops.add_rms_norm(x, res, w2, eps)
    torch.testing.assert_close(total, x + res, atol=0, rtol=0)
    torch.testing.assert_close(normed, rms_norm(x + res, w2, eps), atol=1e-5, rtol=1e-5)
    pos = torch.randint(0, 4000, (tokens,))
    cos, sin = RotaryEmbedding(RopeConfig(theta=10000.0), d).cos_sin(pos, torch.float32, 3999)
    q_before = q.clone()
    rq, rk = ops.rotary(q, k, cos, sin)
    torch.testing.assert_close(rq, apply_rotary(q, cos, sin), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rk, apply_rotary(k, cos, sin), atol=1e-5, rtol=1e-5)
    assert torch.equal(q, q_before)  # inputs untouched


def _bf16_ulps(a, b):
    """Distance in bf16 units in the last place (same sign assumed; the values here are not near zero)."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    return (ia - ib).abs()


@pytest.mark.parametrize("tokens,heads", [(1, 1), (7, 9), (300, 3)])
def test_fused_ops_round_bf16_where_the_reference_does(tokens, heads):
    """bfloat16 models take the fused kernels too: each rounds to bf16 exactly where the reference's aten ops
    do, so RoPE and the residual sum are bit-identical and the norms differ by at most one bf16 unit (the
    float32 mean is summed in another order, which can move a value across a rounding boundary)."""
    from rtp_llm.config.model_config import RopeConfig
    from rtp_llm.device.torch_ops import apply_rotary, rms_norm
    from rtp_llm.layers.rotary import RotaryEmbedding

    torch.manual_seed(100 + tokens)
    ops, d, eps = CpuOps(), 64, 1e-5
    qkv = torch.randn(tokens, (heads + 2) * d).bfloat16()
    q, k = qkv[:, :heads * d].reshape(tokens, heads, d), qkv[:, heads * d:(heads + 1) * d].reshape(tokens, 1, d)
    pos = torch.randint(0, 4000, (tokens,))
    cos, sin = RotaryEmbedding(RopeConfig(theta=10000.0), d).cos_sin(pos, torch.bfloat16, 3999)
    for fused, plain in zip(ops.rotary(q, k, cos, sin), (apply_rotary(q, cos, sin), apply_rotary(k, cos, sin))):
        assert fused.dtype == torch.bfloat16 and torch.equal(fused, plain)
    x, res, w = torch.randn(tokens, 576).bfloat16(), torch.randn(tokens, 576).bfloat16(), torch.randn(576).bfloat16()
    normed, total = ops.add_rms_norm(x, res, w, eps)
    assert torch.equal(total, x + res)
    want = rms_norm(x + res, w, eps)
    assert normed.dtype == torch.bfloat16 and _bf16_ulps(normed, want).max().item() <= 1
    assert (normed == want).float().mean().item() > 0.99
    assert _bf16_ulps(ops.rms_norm(x, w, eps), rms_norm(x, w, eps)).max().item() <= 1
    with pytest.raises(RuntimeError, match="weight must be"):
        ops.kernels.rms_norm(x, w.float(), eps)  # mixed dtypes are refused, not reinterpreted


@pytest.mark.parametrize("shape", [(1, 2 * 1536), (37, 2 * 20), (3, 5, 2 * 64)])
def test_silu_and_mul_equals_the_reference(shape):
    """float32 within float32 rounding of F.silu(gate) * up (another exp implementation); bfloat16 rounded
    where the two aten ops round, so at most one bf16 unit apart (an exp 1 ulp off can cross a boundary);
    tails of rows that are not a multiple of 8 (20) take the scalar loop."""
    torch.manual_seed(shape[0])
    ops, ref = CpuOps(), TorchOps()
    x = torch.randn(*shape) * 4
    x.view(-1)[:4] = torch.tensor([-100.0, 100.0, 0.0, -20.0])  # saturated exp, exact zero
    torch.testing.assert_close(ops.silu_and_mul(x), ref.silu_and_mul(x), atol=1e-6, rtol=1e-6)
    xb = x.bfloat16()
    got, want = ops.silu_and_mul(xb), ref.silu_and_mul(xb)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    tiny = want.float().abs() < 1e-30  # silu(-100): both ~0 (the vector exp saturates at e^88)
    assert (got.float()[tiny].abs() < 1e-30).all()
    assert _bf16_ulps(got[~tiny], want[~tiny]).max().item() <= 1 and (got == want).float().mean().item() > 0.99


@pytest.mark.parametrize("variant,dtype", [("llama_gqa4_tied_attnbias", "float32"),
                                           ("qwen3_gqa2_headdim32_untied", "float32"),
                                           ("llama_gqa4_tied_attnbias", "bfloat16")])
def test_prepared_model_logits_equal_the_plain_model(tmp_path, variant, dtype):
    from rtp_llm.cache import KVBuffer
    from rtp_llm.device.forward_batch import ForwardBatch

    make_checkpoint(tmp_path, variant)
    plain, cfg = load_model(str(tmp_path), ops=TorchOps(), dtype=dtype)
    packed, _ = load_model(str(tmp_path), ops=CpuOps(), dtype=dtype)
    # auto, for a tiny model: the GEMV kernel serves few-row steps, except where panels serve every row count
    assert packed.ops.keeps_plain_weights == (getattr(torch, dtype) not in packed.ops.panel_dtypes
                                              and (dtype != "bfloat16" or onednn_bf16()))  # else plain weights only
    tokens = [list(range(3, 40)), list(range(50, 55))]
    slots = [list(range(0, 37)), list(range(48, 53))]
    table = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [6, 7, 8, 9, 0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    batch = ForwardBatch.build(tokens, [0, 0], slots, table.numpy(), 8)
    # then a decode step of 2 rows, which the GEMV kernel serves in every linear layer
    step = ForwardBatch.build([[40], [55]], [37, 5], [[37], [53]], table.numpy(), 8)
    outs = []
    for model in (plain, packed):
        kv = KVBuffer(cfg.num_layers, 12, 8, cfg.num_kv_heads, cfg.head_dim, dtype=getattr(torch, dtype))
        attn = TorchRefAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5, 8)
        outs.append(torch.cat([model(copy.copy(batch), kv, attn).float(), model(copy.copy(step), kv, attn).float()]))
    if dtype == "float32":
        torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=0)
    else:  # bf16 GEMMs: same fp32 accumulation, another summation order; bf16 activations amplify that
        assert (outs[1] - outs[0]).abs().max().item() < 0.05 * outs[0].abs().max().item()
        assert torch.equal(outs[1].argmax(-1), outs[0].argmax(-1))


@pytest.mark.parametrize("rows", [1, 32, 300])
def test_packed_bf16_linear_accumulates_in_fp32(rows):
    """bf16 weights and activations, fp32 accumulation: the error is the output's bf16 rounding, not K sums
    of bf16 roundings (which would be ~sqrt(K) times larger)."""
    torch.manual_seed(rows)
    down = _linear(1536, 256, dtype=torch.bfloat16)
    w = down.weight.detach().clone()
    ops = CpuOps(gemv_weights="off")
    ops.prepare_linears([down], _tied_head(1000, 1536))
    x = torch.randn(rows, 1536).bfloat16()
    out = down(x)
    # panels or oneDNN's copy replace the plain weight; where neither packs bf16, torch's matmul on it
    packed = torch.bfloat16 in ops.panel_dtypes or onednn_bf16()
    assert out.dtype == torch.bfloat16 and down.weight.numel() == (0 if packed else w.numel())
    ref = x.double() @ w.double().t()
    rel = ((out.double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    assert rel < 2 ** -7  # one bf16 rounding of the result (8 significant bits)


@pytest.mark.parametrize("variant", ["qwen3_gqa2_headdim32_untied", "qwen2_gqa4_bias_untied"])
def test_the_fused_ops_weight_slots_are_the_layers_named_parts(tmp_path, variant):
    """The C++ op names its weight slots and linear layers; the list it reads is built by those names from each
    layer's parts: every name resolves, the required ones are there, the optional ones are None exactly where the
    model lacks them (Qwen2: no q/k norms; Qwen3: no qkv bias)."""
    make_checkpoint(tmp_path, variant)
    model, cfg = load_model(str(tmp_path), ops=CpuOps(gemv_weights="off"))
    kernels = model.ops.kernels
    slots, linears = kernels.decoder_layer_slots(), kernels.decoder_layer_linears()
    assert len(set(slots)) == len(slots) and set(linears) == set(model.layers[0].LINEARS)
    fused = model.fused_layers
    assert fused.usable and len(fused.weights) == len(slots) * cfg.num_layers
    assert len(fused.sizes) == 2 * len(linears) * cfg.num_layers
    last = model.layers[-1]
    got = dict(zip(slots, fused.weights[-len(slots):]))
    assert got["input_norm"] is last.input_norm.weight and got["post_norm"] is last.post_norm.weight
    assert got["down.packed"] is last.mlp.down.kernel.packed and got["o.packed"] is last.o.kernel.packed
    assert (got["q_norm"] is None) == (not cfg.qk_norm) and (got["qkv.bias"] is None) == (not cfg.qkv_bias)
    assert fused.sizes[-2] == last.mlp.down.kernel.out_features == cfg.hidden_size
    with pytest.raises(KeyError, match="no part"):
        last.part("router")


@pytest.mark.parametrize("variant,dtype,linear", [("llama_gqa4_tied_attnbias", "float32", "gemv"),
                                                  ("qwen3_gqa2_headdim32_untied", "float32", "gemv"),
                                                  ("qwen2_gqa4_bias_untied", "bfloat16", "gemv"),
                                                  ("llama_gqa4_tied_attnbias", "float32", "packed"),
                                                  ("qwen2_gqa4_bias_untied", "bfloat16", "packed"),
                                                  ("qwen3_gqa2_headdim32_untied", "bfloat16", "packed"),
                                                  ("qwen3_gqa2_headdim32_untied", "float32", "int8"),
                                                  ("qwen3_gqa2_headdim32_untied", "bfloat16", "int8")])
def test_fused_layers_in_one_call_equal_the_layer_by_layer_path(tmp_path, variant, dtype, linear):
    """The C++ decoder_layers op runs the same kernels on the same rows as the Python layers: bit-identical logits
    and KV cache over a prefill of two prompts, several decode steps of 1-2 sequences, a step with a short chunk
    beside a decode (paged rows) and a longer chunk after a cached prefix (the prefill kernel), with biases,
    Qwen3's q/k norms, bf16, and the GEMV kernel or (as for decode batches past its row count) oneDNN's packed
    GEMM in the linear layers; float32 and bf16 with AVX2: the panel kernel either way (the GEMV and oneDNN
    variants run only where panels do not: CPUs without AVX2, odd bf16 widths). Prefill steps are fused where every
    kernel treats rows independently (panels), also with pieces of 5 rows that cut across sequences, or where every
    row takes the paged kernel (no prefill kernel)."""
    from rtp_llm.cache import KVBuffer
    from rtp_llm.device.forward_batch import ForwardBatch

    make_checkpoint(tmp_path, variant)
    model, cfg = load_model(str(tmp_path), ops=CpuOps(gemv_weights="on" if linear == "gemv" else "off"),
                            dtype=dtype, quantization="int8" if linear == "int8" else "auto")
    ops = model.ops
    blocks = linear == "int8"  # per-channel int8 blocks: quant_linear, rows independent on every CPU
    panels = getattr(torch, dtype) in ops.panel_dtypes and not blocks
    # bf16 where oneDNN cannot pack it (no avx512bw / avx_ne_convert) and no panels: the plain weight alone
    plain_only = dtype == "bfloat16" and not (panels or blocks or onednn_bf16())
    assert model.layers[0].qkv.weight.numel() == (0 if (linear in ("packed", "int8") or panels) and not plain_only
                                                  else cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads)
                                                  * cfg.head_dim)  # off: only the packed copies remain
    assert (model.layers[0].qkv.kernel.packed is None) == plain_only
    assert plain_only or model.layers[0].qkv.kernel.packed.dim() == (3 if panels or blocks else 2)
    assert plain_only or (model.layers[0].qkv.kernel.packed.dtype == torch.uint8) == blocks
    fused_calls = []
    original = model.fused_layers
    assert original.rows_independent == (panels or blocks)

    class Watched:  # records, step by step, whether the step's layers ran in the one C++ call
        def runs(self, meta):
            fused_calls.append(original.runs(meta))
            return fused_calls[-1]

        def __call__(self, *args):
            return original(*args)

    model.fused_layers = Watched()
    table = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 0]], dtype=torch.int32).numpy()
    # the prefill kernel (AVX-512, head_dim a multiple of 16) and row-independent kernels; without the prefill kernel
    # every row is paged, and a step of paged rows is always one call
    prefill_kernel = ops.kernels.cpu_isa() == "avx512" and cfg.head_dim % 16 == 0
    prefill_fused = (panels or blocks) or not prefill_kernel
    results = []
    for fuse, pieces in ((False, 512), (True, 512), (True, 5)):
        original.enabled, original.piece_rows = fuse, pieces
        kv = KVBuffer(cfg.num_layers, 12, 8, cfg.num_kv_heads, cfg.head_dim, dtype=getattr(torch, dtype))
        attn = CpuAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5, 8)
        logits = [model.compute_logits(model(ForwardBatch.build([list(range(3, 20)), list(range(30, 41))], [0, 0],
                                                                [list(range(8, 25)), list(range(56, 67))], table, 8),
                                             kv, attn))]
        lens = [17, 11]
        for step in range(5):
            rows = [0, 1] if step % 2 == 0 else [1]  # 2 sequences, then 1
            toks = [[int(logits[-1][min(r, logits[-1].shape[0] - 1)].argmax())] for r in rows]
            slots = [[8 + lens[r]] if r == 0 else [56 + lens[r]] for r in rows]
            batch = ForwardBatch.build(toks, [lens[r] for r in rows], slots, table[rows], 8)
            logits.append(model.compute_logits(model(batch, kv, attn)))
            for r in rows:
                lens[r] += 1
        # a chunk of 3 new tokens after sequence 0's cached 20 (a prompt suffix after a prefix-cache hit)
        # beside a decode: 4 rows, each attended with its own causal length, still one C++ call
        batch = ForwardBatch.build([[5, 6, 7], [9]], lens, [[8 + lens[0] + j for j in range(3)], [56 + lens[1]]],
                                   table, 8)
        logits.append(model.compute_logits(model(batch, kv, attn)))
        lens = [lens[0] + 3, lens[1] + 1]
        # a 12-token chunk after sequence 0's 23: the prefill kernel over a cached prefix
        batch = ForwardBatch.build([list(range(60, 72))], [lens[0]], [[8 + lens[0] + j for j in range(12)]],
                                   table[:1], 8)
        logits.append(model.compute_logits(model(batch, kv, attn)))
        results.append((logits, kv.buffer.clone()))
        prefills = [0, len(fused_calls) - 1]
        assert all(c == fuse for i, c in enumerate(fused_calls) if i not in prefills), fused_calls
        assert all(fused_calls[i] == (fuse and prefill_fused) for i in prefills), fused_calls
        fused_calls.clear()
    plain_logits, plain_kv = results[0]
    for fused_logits, fused_kv in results[1:]:
        for a, b in zip(plain_logits, fused_logits):
            assert torch.equal(a, b)
        assert torch.equal(plain_kv, fused_kv)


@pytest.mark.skipif(not _has_avx512(), reason="without AVX-512 the tests above already run these paths")
def test_avx2_paths_on_an_avx512_cpu(tmp_path):
    """RTP_LLM_CPU_NO_AVX512=1 gives what a CPU without AVX-512 runs: the AVX2 panel kernels (float32 and bf16), the
    AVX2 paged-attention path for every row (no prefill kernel). This file's panel, linear-layer and fused-layers
    tests and the attention kernel's tests again, in a process of their own (the choice is made once per
    process); and the AVX2 float32 panels give the AVX-512 panels' bits."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RTP_LLM_CPU_NO_AVX512="1", PYTHONPATH=os.pathsep.join(sys.path))
    attention_tests = os.path.join(os.path.dirname(__file__), "test_cpu_attention.py")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, attention_tests,
                           "-k", "panel_kernel or packed_linear or packed_bf16 or fused_layers or prepared_model or "
                           "decode_kernel or prefill_rows"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-2000:]
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(37, 300, generator=g), torch.randn(100, 300, generator=g), torch.randn(100, generator=g)
    k_ops = CpuOps().kernels
    wide = k_ops.panel_linear(x, k_ops.pack_panels(w), b, 100)
    code = ("import sys, torch; from rtp_llm._native import ops; x, w, b = torch.load(sys.argv[1]); "
            "torch.save(ops().panel_linear(x, ops().pack_panels(w), b, 100), sys.argv[1])")
    path = str(tmp_path / "avx2_panels.pt")
    torch.save((x, w, b), path)
    subprocess.run([sys.executable, "-c", code, path], env=env, check=True, timeout=300)
    assert torch.equal(torch.load(path), wide)


def test_bf16_panels_run_on_amx_tiles_where_the_cpu_has_them():
    """On a CPU with AMX (amx_bf16) every bf16 panel GEMM whose K is a multiple of 32 runs TDPBF16PS, whose tile
    step sums its products without rounding after each (measured; vdpbf16ps rounds after every product): the row
    [2^24, 1, -2^24, 0, ...] . [1, ..., 1] is the exact 1 there and 0 on vdpbf16ps (2^24 + 1 rounds to 2^24
    first). Rows stay independent of the batch on either (the panel test above; the engine's batch tests)."""
    k_ops = CpuOps().kernels
    if not k_ops.cpu_avx512_bf16():
        pytest.skip("no bf16 panels on this CPU")
    amx = k_ops.cpu_amx_bf16()
    for k in (32, 576):  # K % 32 == 0: the tiles (with AMX)
        x = torch.zeros(3, k, dtype=torch.bfloat16)
        x[:, :3] = torch.tensor([2.0 ** 24, 1.0, -(2.0 ** 24)])
        w = torch.ones(50, k, dtype=torch.bfloat16)
        out = k_ops.panel_linear(x, k_ops.pack_panels(w), None, 50)
        assert torch.equal(out, torch.full_like(out, 1.0 if amx else 0.0)), (k, amx, out[0, :4])
        gated = k_ops.panel_linear_silu(x, k_ops.pack_gated_panels(w), None, 25)
        want = torch.nn.functional.silu(torch.tensor(1.0 if amx else 0.0)) * (1.0 if amx else 0.0)
        assert torch.equal(gated, torch.full_like(gated, want).bfloat16()), (k, amx, gated[0, :4])
    x = torch.zeros(1, 48, dtype=torch.bfloat16)  # K = 48: not whole tile steps, the vdpbf16ps tiles either way
    x[0, :3] = torch.tensor([2.0 ** 24, 1.0, -(2.0 ** 24)])
    assert k_ops.panel_linear(x, k_ops.pack_panels(torch.ones(16, 48, dtype=torch.bfloat16)), None, 16).eq(0).all()


def test_vdpbf16ps_paths_on_an_amx_cpu():
    """RTP_LLM_CPU_NO_AMX=1 gives what an avx512_bf16 CPU without AMX runs (the vdpbf16ps tiles): this file's
    panel, gated and linear-layer tests and the test above in a process of their own."""
    import os
    import subprocess
    import sys

    if not CpuOps().kernels.cpu_amx_bf16():
        pytest.skip("no AMX on this CPU: the tests above ran the vdpbf16ps tiles")

    env = dict(os.environ, RTP_LLM_CPU_NO_AMX="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "panel or gated or packed or fused_layers or amx_tiles"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
    probe = subprocess.run([sys.executable, "-c", "import rtp_llm._native as n; print(n.ops().cpu_amx_bf16())"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stdout + probe.stderr


def test_prefill_mlp_in_row_pieces_is_bit_identical():
    """A prefill's MLP runs in pieces of MLP_ROWS rows (its gate_up output then stays in cache); every kernel
    treats rows independently, so the pieces give exactly the unsplit result, which matches float64."""
    torch.manual_seed(3)
    gate_up, down = _linear(80, 96, bias=True, feeds_silu=True), _linear(48, 80, bias=True)
    ref_w = {"gate_up_weight": gate_up.weight.detach().clone(), "down_weight": down.weight.detach().clone()}
    b1, b2 = gate_up.bias.detach().clone(), down.bias.detach().clone()
    ops = CpuOps()
    ops.prepare_linears([gate_up, down], _tied_head(1000, 80))
    h = torch.randn(1100, 80)
    ops.MLP_ROWS = 256
    pieces = ops.mlp(h, gate_up, down)
    ops.MLP_ROWS = 1 << 20
    whole = ops.mlp(h, gate_up, down)
    if ops.panel_dtypes:
        assert torch.equal(pieces, whole)
    gu = h.double() @ ref_w["gate_up_weight"].double().t() + b1.double()
    want = (torch.nn.functional.silu(gu[:, :48]) * gu[:, 48:]) @ ref_w["down_weight"].double().t() + b2.double()
    torch.testing.assert_close(pieces.double(), want, atol=1e-3, rtol=1e-4)


def _anon_huge_kb() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def test_kv_cache_buffer_is_zeroed_and_on_huge_pages_where_the_os_allows():
    """CpuDevice.zeros (the KV cache's allocator): zeros of the asked shape and dtype, writable, freed with the
    tensor; where transparent huge pages are on request (madvise) or always, the buffer sits on them."""
    import gc

    from rtp_llm.device.cpu import CpuDevice

    device = CpuDevice()
    buf = device.zeros((2, 2, 64, 16, 4, 64), torch.bfloat16)
    assert buf.shape == (2, 2, 64, 16, 4, 64) and buf.dtype == torch.bfloat16 and not buf.any()
    buf[1, 0, 3] = 2.0
    assert buf.sum().item() == 2.0 * 16 * 4 * 64
    del buf
    gc.collect()
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        mode = "[never]"
    if "[never]" in mode or _anon_huge_kb() < 0:
        pytest.skip(f"transparent huge pages are off here ({mode.strip()})")
    before = _anon_huge_kb()
    big = device.zeros((64, 1024, 1024), torch.float32)  # 256 MB
    assert _anon_huge_kb() - before >= 128 * 1024, "the KV cache buffer is not on huge pages"
    assert not big[::4096].any()
