"""Greedy steps on CPU: the LM head's argmax found through a bf16 screen with a proven error bound
(rtp_llm/cpp/cpu/greedy_head.cc) is exactly torch.argmax of the fp32 logits the panel kernel computes, on
weights built so that bf16 cannot tell the best rows apart, on exact ties (the lowest id wins, as
torch.argmax) and on rows with non-finite values (left to the full logits); and an engine's greedy
generations are token for token the same with and without the screen, while requests that need logits
(logprobs, penalties, sampling) still get them."""

from __future__ import annotations

import pytest
import torch

from rtp_llm._native import ops as native_ops
from rtp_llm.device.cpu.ops import CpuOps
from rtp_llm.layers.linear import Linear
from rtp_llm.models.registry import load_model

K = native_ops()
pytestmark = pytest.mark.skipif(not K.cpu_avx512_bf16(),
                                reason="needs a CPU with AVX-512 and avx512_bf16 (the screen is off elsewhere)")


def _reference(h, w):
    """torch.argmax of the logits the fp32 path samples from (the panel kernel)."""
    return K.panel_linear(h, K.pack_panels(w), None, w.shape[0]).argmax(dim=-1)


# K % 32 == 0 screens on AMX tiles where the CPU has them (1-16 rows one tile high; 20: a 16-row tile and a
# zero-padded one; 32), the rest on vdpbf16ps; test_screens_without_amx reruns these with AMX off.
@pytest.mark.parametrize("rows,n,k", [(1, 4099, 576), (7, 1000, 75), (8, 333, 64), (9, 2048, 130),
                                      (20, 3001, 96), (32, 49152, 576)])
def test_screen_equals_the_argmax_of_the_fp32_logits(rows, n, k):
    g = torch.Generator().manual_seed(rows * 7 + k)
    w = torch.randn(n, k, generator=g) * 0.05
    h = torch.randn(rows, k, generator=g) * 4
    # Row 0 points at a block of vocab rows that bf16 cannot tell apart: copies of one row with relative
    # perturbations of 1e-5 (below bf16's 2^-9 resolution), so the screen's values tie and only the fp32
    # recompute orders them. Row 1 (where there is one) aims at two exact duplicates: the lower id wins.
    base = w[n // 3].clone()
    block = torch.arange(n // 3, min(n, n // 3 + 40))
    w[block] = base * (1 + 1e-5 * torch.randn(len(block), k, generator=g))
    h[0] = base * 50
    if rows > 1:
        w[n - 1] = w[n // 2]
        h[1] = w[n // 2] * 50
    screen, bounds = K.pack_greedy_screen(w)
    got = K.greedy_head(h, screen, bounds, w)
    ref = _reference(h, w)
    assert torch.equal(got, ref)
    assert int(got[0]) in block.tolist()
    if rows > 1:
        assert int(got[1]) == n // 2  # the first of the duplicates
    # the bf16 screen alone would not do: its own argmax disagrees on the built rows
    approx = (h.bfloat16().float() @ w.bfloat16().float().t()).argmax(dim=-1)
    assert not torch.equal(approx, ref)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_a_head_of_packed_gguf_blocks_gives_the_argmax_of_its_logits(fmt):
    """quant_greedy_head: the screen's bf16 weights and the candidates' exact rows decoded from the packed blocks
    (no copy of the head): exactly torch.argmax of quant_linear's logits, ties to the lowest id."""
    from tests.models.gguf_blocks import as_blocks, quantized

    n, k = 2000, 512
    raw = quantized(fmt, n, k, seed=4)
    raw[n - 1] = raw[n // 2]  # two identical vocab rows
    raw[n // 3 + 1] = raw[n // 3]
    packed = K.quant_pack([as_blocks(raw, fmt)])
    dense = K.quant_dequantize(as_blocks(raw, fmt))
    bounds = K.greedy_bounds(dense)
    g = torch.Generator().manual_seed(5)
    h = torch.randn(24, k, generator=g)
    h[:8] += dense[torch.randint(0, n, (8,), generator=g)] * 20  # rows aimed at vocab rows
    h[8] = dense[n // 2] * 50
    h[9] = dense[n // 3] * 50
    h[10, 3] = float("nan")
    ref = K.quant_linear(h, packed, None, n).argmax(dim=-1)
    got = K.quant_greedy_head(h, packed, bounds, n)
    assert got[10] == -1  # a non-finite row: left to the full logits
    keep = torch.arange(24) != 10
    assert torch.equal(got[keep], ref[keep])
    assert bool((got != n - 1).all() and (got != n // 3 + 1).all())  # of two identical rows, the lower id
    if not fmt.endswith("_K"):  # (random k-quant rows carry mins: their dot products follow the norms)
        assert got[8] == n // 2 and got[9] == n // 3
    for r in (0, 9, 23):  # a row alone: the same id
        assert K.quant_greedy_head(h[r:r + 1], packed, bounds, n)[0] == got[r]
    with pytest.raises(RuntimeError, match="columns"):
        K.quant_greedy_head(torch.randn(2, 256), packed, bounds, n)
    with pytest.raises(RuntimeError, match="bounds must be"):
        K.quant_greedy_head(h, packed, bounds[:, :10], n)


def test_screens_without_amx():
    """RTP_LLM_CPU_NO_AMX=1 gives the screens an avx512_bf16 CPU without AMX runs (vdpbf16ps tiles): the two tests
    above in a process of their own (on an AMX CPU they ran the tiles)."""
    import os
    import subprocess
    import sys

    if not K.cpu_amx_bf16():
        pytest.skip("no AMX on this CPU: the tests above ran the vdpbf16ps tiles")
    env = dict(os.environ, RTP_LLM_CPU_NO_AMX="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "screen_equals or packed_gguf_blocks"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "14 passed" in proc.stdout, proc.stdout[-2000:]  # 6 dense shapes, 8 formats


def test_rows_with_non_finite_values_are_left_to_the_full_logits():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(500, 64, generator=g)
    h = torch.randn(3, 64, generator=g)
    h[1, 5] = float("nan")
    h[2, 0] = float("inf")
    screen, bounds = K.pack_greedy_screen(w)
    got = K.greedy_head(h, screen, bounds, w)
    assert got[1] == -1 and got[2] == -1 and got[0] == _reference(h[:1], w)[0]
    head = Linear(64, 500, False, torch.float32, "cpu", tied=torch.nn.Parameter(w, requires_grad=False))
    head.kernel.screen = (screen, bounds)
    # CpuOps.greedy_tokens computes those rows' logits in full: torch.argmax decides what NaN means
    assert torch.equal(CpuOps().greedy_tokens(h, head), (w @ h.t()).t().argmax(dim=-1))


def test_bad_arguments_are_named():
    w = torch.randn(100, 32)
    screen, bounds = K.pack_greedy_screen(w)
    with pytest.raises(RuntimeError, match="screen must be"):
        K.greedy_head(torch.randn(2, 32), screen[:1], bounds, w)
    with pytest.raises(RuntimeError, match="weight must be"):
        K.greedy_head(torch.randn(2, 32), screen, bounds, torch.randn(100, 16))
    with pytest.raises(RuntimeError, match="non-finite"):
        K.pack_greedy_screen(torch.full((4, 4), float("inf")))


@pytest.mark.parametrize("variant", ["qwen3_gqa2_headdim32_untied", "llama_gqa4_tied_attnbias"])
def test_engine_greedy_steps_use_the_screen_and_give_transformers_tokens(tmp_path, variant):
    from tests.engine.helpers import Tiny, run_all
    from rtp_llm.sampling import SamplingParams

    tiny = Tiny(tmp_path, variant)
    tiny.model, _ = load_model(str(tmp_path), ops=CpuOps(), dtype="float32")  # the CPU engine's op set
    ops = tiny.model.ops
    assert isinstance(ops, CpuOps) and tiny.model.head.kernel.screen is not None
    kernel, calls = ops.kernels, []

    class Counting:  # the screen's C++ op, counted; every other op passes through
        def __getattr__(self, name):
            if name == "greedy_head":
                return lambda *a: calls.append(1) or kernel.greedy_head(*a)
            return getattr(kernel, name)

    ops.kernels = Counting()
    prompts = [[3 + i, 17, 5 + 2 * i, 9, 11 + i] for i in range(6)]
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    out = run_all(tiny.engine(), [(i, f"g{i}", p, greedy) for i, p in enumerate(prompts)])
    tokens = [out[f"g{i}"].outputs[0].token_ids for i in range(len(prompts))]
    assert calls, "greedy steps did not go through the screen"
    assert tokens == [tiny.greedy(p, 10) for p in prompts]
    # Requests that need the logits (logprobs, a penalty) take the sampler's path: no screen in their steps.
    n = len(calls)
    needs = [SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2),
             SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, repetition_penalty=1.3)]
    out = run_all(tiny.engine(), [(0, f"n{i}", prompts[0], p) for i, p in enumerate(needs)])
    assert len(calls) == n
    assert out["n0"].outputs[0].token_ids == tokens[0] and len(out["n0"].outputs[0].logprobs) == 10
    # and without the screen, the same greedy tokens
    tiny.model.head.kernel.screen = None
    out = run_all(tiny.engine(), [(i, f"g{i}", p, greedy) for i, p in enumerate(prompts)])
    assert [out[f"g{i}"].outputs[0].token_ids for i in range(len(prompts))] == tokens
