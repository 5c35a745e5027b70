"""The CPU LoRA kernel (rtp_llm/cpp/cpu/lora_add.cc, CpuOps.lora_pack + lora_add) against float64 arithmetic
written out here: y[rows] += (x[rows] @ a_t) @ bt, several adapter groups in one call, float32, bfloat16 and float16;
fused modules packed as segments (their zero blocks neither stored nor read) give the dense product; a row's bits do
not depend on its group or the other groups; bad calls are refused by name."""

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


def _packed(groups, segments=None):
    return [(rows, *OPS.lora_pack(a_t, bt, segments)) for rows, a_t, bt in groups]


def _assert_close(got, want, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    else:  # one rounding of the float32 sum to 16 bits: within one step of the exact value
        step = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -11
        assert ((got.double() - want).abs() <= want.abs() * step + 1e-2).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_groups_add_their_deltas_to_their_rows_only(dtype):
    x, y, (w0, w1, w2) = _case()
    x, y = x.to(dtype), y.to(dtype)
    groups = [(torch.tensor([0, 5, 6]), *w0), (torch.tensor([12, 1]), *w1), (torch.tensor([3, 4, 7, 8, 9]), *w2)]
    got = y.clone()
    OPS.lora_add(x, got, _packed(groups))
    untouched = [2, 10, 11]
    assert torch.equal(got[untouched], y[untouched])
    _assert_close(got, _expected(x, y, groups), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_modules_packed_as_segments_give_the_dense_product(dtype):
    """A qkv-like adapter: three modules' rank rows and output columns (widths not multiples of 8, one module of
    rank 1) with zeros between them in the joined bt; packed by segments, tiles hold only their module's rows."""
    x, y, _ = _case(tokens=11, n=211)
    x, y = x.to(dtype), y.to(dtype)
    g = torch.Generator().manual_seed(4)
    segments = [(0, 8, 0, 100), (8, 9, 100, 157), (9, 13, 157, 211)]
    a_t = torch.randn(70, 13, generator=g) / 8
    bt = torch.zeros(13, 211)
    for r0, r1, c0, c1 in segments:
        bt[r0:r1, c0:c1] = torch.randn(r1 - r0, c1 - c0, generator=g) / 8
    a, b, tiles = OPS.lora_pack(a_t, bt, segments)
    assert b.numel() == sum((r1 - r0) * -(-(c1 - c0) // 8) * 8 for r0, r1, c0, c1 in segments)  # no zero block kept
    got = y.clone()
    OPS.lora_add(x, got, [(None, a, b, tiles)])
    _assert_close(got, _expected(x, y, [(None, a_t, bt)]), dtype)
    dense = y.clone()  # the same adapter packed whole (one segment): the same sums, zeros skipped or not
    OPS.lora_add(x, dense, _packed([(None, a_t, bt)]))
    _assert_close(dense, _expected(x, y, [(None, a_t, bt)]), dtype)


# (tokens, k): steps of many blocks and of the few a decode step has (3 groups of 1 row; of 7, 7 and 6 rows), with
# adapters small and large enough for a split call
@pytest.mark.parametrize("tokens,k", [(40, 70), (40, 600), (3, 600), (20, 600)])
def test_every_row_alone_is_the_same_bits_as_in_a_step(tokens, k):
    x, y, (w0, w1, w2) = _case(tokens=tokens, k=k)
    groups = _packed([(torch.arange(0, tokens, 3), *w0), (torch.arange(1, tokens, 3), *w1),
                      (torch.arange(2, tokens, 3), *w2)])
    together = y.clone()
    OPS.lora_add(x, together, groups)
    _assert_close(together, _expected(x, y, [(rows, a_t, bt) for (rows, _, _, _), (a_t, bt)
                                               in zip(groups, (w0, w1, w2))]), torch.float32)
    for rows, *packed in groups:
        for r in rows.tolist():
            alone = y[r:r + 1].clone()
            OPS.lora_add(x[r:r + 1], alone, [(None, *packed)])
            assert torch.equal(alone[0], together[r]), r


def test_bad_calls_are_refused_by_name():
    x, y, (w0, w1, _) = _case()
    p0, p1 = OPS.lora_pack(*w0), OPS.lora_pack(*w1)
    with pytest.raises(RuntimeError, match="in two groups"):
        OPS.kernels.lora_add_(y, x, [torch.tensor([1, 2]), torch.tensor([2])], [p0[0], p1[0]], [p0[1], p1[1]],
                              [p0[2], p1[2]])
    with pytest.raises(RuntimeError, match="outside"):
        OPS.kernels.lora_add_(y, x, [torch.tensor([13])], [p0[0]], [p0[1]], [p0[2]])
    with pytest.raises(RuntimeError, match="packed weights"):
        OPS.kernels.lora_add_(y, x, [None], [w0[0]], [p0[1]], [p0[2]])  # a_t as it was before packing
    wide = p0[2].clone()
    wide[-1, 3] = y.shape[1] - 1  # the last tile (2 columns) one column past y's end
    with pytest.raises(RuntimeError, match="tile .* reaches outside"):
        OPS.kernels.lora_add_(y, x, [None], [p0[0]], [p0[1]], [wide])


def lora_bits(path: str) -> None:
    """Deltas of several shapes (segments of widths not multiples of 8, gate_up's tiles remapped to gated panels'
    columns, groups of 1 to 11 rows, float32 and bfloat16) written to `path`; run once per instruction set."""
    from rtp_llm.device.cpu.fused_layers import _gated_tiles

    g = torch.Generator().manual_seed(9)
    outs = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(24, 70, generator=g).to(dtype)
        for segments, n in (([(0, 8, 0, 100), (8, 9, 100, 157), (9, 13, 157, 211)], 211),
                            ([(0, 16, 0, 48), (16, 32, 48, 96)], 96), ([(0, 24, 0, 40)], 40)):
            r = segments[-1][1]
            a_t = torch.randn(70, r, generator=g) / 8
            bt = torch.randn(r, n, generator=g) / 8
            a, b, tiles = OPS.lora_pack(a_t, bt, segments)
            for t in (tiles, _gated_tiles(tiles, n // 2) if len(segments) == 2 else None):
                if t is None:
                    continue
                width = int((t[:, 3] + t[:, 4]).max())
                y = torch.randn(24, width, generator=g).to(dtype)
                rows = [torch.tensor([0]), torch.arange(1, 12), torch.arange(12, 15)]
                OPS.lora_add(x, y, [(rw, a, b, t) for rw in rows])
                outs.append(y)
    torch.save(outs, path)


def test_the_avx2_and_avx512_kernels_give_the_same_bits(tmp_path):
    """Lanes are independent: the AVX-512 kernel (16 lanes, tiles paired) and the AVX2 one (RTP_LLM_CPU_NO_AVX512=1,
    what CPUs without AVX-512 run) give every element the same multiply-adds in the same order. On a CPU without
    AVX-512 both processes run the AVX2 kernel."""
    import os
    import subprocess
    import sys

    lora_bits(str(tmp_path / "here.pt"))
    env = dict(os.environ, RTP_LLM_CPU_NO_AVX512="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", "import sys; from tests.device.cpu.test_lora_add import lora_bits; "
                           "lora_bits(sys.argv[1])", str(tmp_path / "avx2.pt")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    here, avx2 = torch.load(tmp_path / "here.pt"), torch.load(tmp_path / "avx2.pt")
    assert len(here) == len(avx2) == 8
    for a, b in zip(here, avx2):
        assert torch.equal(a, b)
