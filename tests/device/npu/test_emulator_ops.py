"""The torch_npu emulator's operators against independent plain implementations, and the
documented constraints each must enforce."""

import math

import pytest
import torch

from tests.npu_emulator.install import install

torch_npu = install()
from torch_npu._ops import NPUOpError  # noqa: E402

from tests.device.npu.helpers import plain_attention  # noqa: E402

torch.npu.set_device(0)
NPU = torch.device("npu", 0)


def npu(t):
    return t.to(NPU)


def _setup(q_lens, kv_lens, N=4, KV=2, D=128, bs=128, nb=8, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    T = sum(q_lens)
    q = torch.randn(T, N, D, generator=g).to(dtype)
    kc = torch.randn(nb, bs, KV, D, generator=g).to(dtype)
    vc = torch.randn(nb, bs, KV, D, generator=g).to(dtype)
    width = max((k + bs - 1) // bs for k in kv_lens)
    perm = torch.randperm(nb - 1, generator=g) + 1
    bt = torch.zeros(len(q_lens), width, dtype=torch.int32)
    used = 0
    for b, k in enumerate(kv_lens):
        n = (k + bs - 1) // bs
        bt[b, :n] = perm[used: used + n].to(torch.int32)
        used += n
    return q, kc, vc, bt


def _fia(q, kc, vc, bt, q_lens, kv_lens, **over):
    nb, bs = kc.shape[0], kc.shape[1]
    cum = [sum(q_lens[: i + 1]) for i in range(len(q_lens))]
    kw = dict(atten_mask=npu(torch.triu(torch.ones(2048, 2048, dtype=torch.int8), 1)), actual_seq_lengths=cum,
              actual_seq_lengths_kv=list(kv_lens), block_table=npu(bt), num_heads=q.shape[1], scale=q.shape[2] ** -0.5,
              input_layout="TND", num_key_value_heads=kc.shape[2], sparse_mode=3, block_size=bs)
    kw.update(over)
    key = over.pop("key", npu(kc).view(nb, bs, -1))
    return torch_npu.npu_fused_infer_attention_score(npu(q), key, npu(vc).view(nb, bs, -1),
                                                     **{k: v for k, v in kw.items() if k != "key"})[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16])
@pytest.mark.parametrize("D", [128, 64])
def test_fia_matches_plain_attention_mixed_batch(dtype, D):
    """bfloat16 inputs, head dim 128 and 64 (the TND tiling's two): the output is the float64 attention of those
    inputs up to one rounding to bfloat16."""
    q_lens, kv_lens = [5, 1, 3], [5, 200, 131]    # a prefill, a decode, a chunk over a cached prefix
    q, kc, vc, bt = _setup(q_lens, kv_lens, D=D, dtype=dtype)
    out = _fia(q, kc, vc, bt, q_lens, kv_lens).cpu()
    assert out.dtype == dtype
    ref = plain_attention(q.double(), kc.double(), vc.double(), bt.tolist(), q_lens, kv_lens, D ** -0.5, kv_heads=2)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2 ** -7)


def test_fia_refuses_float32_and_float16_queries_in_tnd():
    """FIA takes float16 / bfloat16 (or int8) queries (torch_npu docs: query), and in TND layout with a block table
    bfloat16 only (CANN's prompt-flash tiling): a float32 or float16 model would fail on the first real step."""
    q_lens, kv_lens = [2], [2]
    q, kc, vc, bt = _setup(q_lens, kv_lens, dtype=torch.float32)
    with pytest.raises(NPUOpError, match="query dtype torch.float32 is not supported"):
        _fia(q, kc, vc, bt, q_lens, kv_lens)
    q, kc, vc, bt = _setup(q_lens, kv_lens, dtype=torch.float16)
    with pytest.raises(NPUOpError, match="When layout is TND, inputDataType should be bf16"):
        _fia(q, kc, vc, bt, q_lens, kv_lens)


def test_fia_refuses_arguments_it_does_not_have_and_features_not_emulated():
    q_lens, kv_lens = [2], [2]
    q, kc, vc, bt = _setup(q_lens, kv_lens)
    with pytest.raises(TypeError, match="no_such_argument"):
        _fia(q, kc, vc, bt, q_lens, kv_lens, no_such_argument=1)
    with pytest.raises(NPUOpError, match="antiquant_scale is not emulated"):
        _fia(q, kc, vc, bt, q_lens, kv_lens, antiquant_scale=npu(torch.ones(2)))


@pytest.mark.parametrize("name,over,match", [
    ("no mask with sparse_mode 3", dict(atten_mask=None), "atten_mask must not be null"),
    ("leading 0 in the Q cumsum", dict(actual_seq_lengths=[0, 5, 6, 9], actual_seq_lengths_kv=[0, 5, 200, 131]),
     "empty sequence"),
    ("cumulative KV lengths", dict(actual_seq_lengths_kv=[5, 205, 336]), "exceeds"),
    ("kv list shorter than the batch", dict(actual_seq_lengths_kv=[5, 200]), "entries"),
    ("Q list not ending at T", dict(actual_seq_lengths=[5, 6, 8]), "end at T"),
    ("context length below the query count", dict(actual_seq_lengths_kv=[4, 200, 131]), "shorter than"),
    ("3-D block table", "bt3d", "2-D"),
    ("host-side block table", "bthost", "host-side"),
    ("int64 block table", "bt64", "int32"),
    ("non-contiguous cache view", "noncontig", "contiguous"),
    ("block size 16 with prefill", "bs16", "multiple of 128"),
    ("wrong block_size argument", dict(block_size=256), "block_size=256"),
    ("KV lengths as a tensor", "kvtensor", "host list"),
])
def test_fia_constraints(name, over, match):
    q_lens, kv_lens = [5, 1, 3], [5, 200, 131]
    q, kc, vc, bt = _setup(q_lens, kv_lens)
    if over == "bt3d":
        over = dict(block_table=npu(bt).unsqueeze(0))
    elif over == "bthost":
        over = dict(block_table=bt)
    elif over == "bt64":
        over = dict(block_table=npu(bt.long()))
    elif over == "noncontig":
        over = dict(key=npu(kc).view(8, 128, -1)[::2])
    elif over == "bs16":
        q, kc, vc, bt = _setup([5, 1, 3], [5, 20, 13], bs=16, nb=8)
        kv_lens = [5, 20, 13]
        over = {}
    elif over == "kvtensor":
        over = dict(actual_seq_lengths_kv=npu(torch.tensor(kv_lens)))
    with pytest.raises(NPUOpError, match=match):
        _fia(q, kc, vc, bt, q_lens, kv_lens, **over)


def test_fia_rejects_head_dims_tnd_does_not_take():
    q_lens, kv_lens = [2], [2]
    q, kc, vc, bt = _setup(q_lens, kv_lens, D=32)
    with pytest.raises(NPUOpError, match="must be the same and equal 128/64, got 32"):
        _fia(q, kc, vc, bt, q_lens, kv_lens)


@pytest.mark.parametrize("writer", ["scatter", "reshape"])
def test_cache_writes_match_plain_writes(writer):
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(6, 2, 64, generator=g), torch.randn(6, 2, 64, generator=g)
    slots = torch.tensor([3, 130, 131, 500, 7, 255], dtype=torch.int32)
    kc, vc = npu(torch.zeros(4, 128, 2, 64)), npu(torch.zeros(4, 128, 2, 64))
    if writer == "scatter":
        torch_npu.npu_scatter_pa_kv_cache(npu(k), npu(v), kc, vc, npu(slots), cache_mode="Norm")
    else:
        torch_npu._npu_reshape_and_cache(npu(k), npu(v), kc, vc, npu(slots))
        with pytest.raises(NPUOpError, match="slot_indices must be int32"):  # the ATB op takes int32 slots
            torch_npu._npu_reshape_and_cache(npu(k), npu(v), kc, vc, npu(slots.long()))
    ref_k, ref_v = torch.zeros(4, 128, 2, 64), torch.zeros(4, 128, 2, 64)
    for i, s in enumerate(slots.tolist()):
        ref_k[s // 128, s % 128] = k[i]
        ref_v[s // 128, s % 128] = v[i]
    assert torch.equal(kc.cpu(), ref_k) and torch.equal(vc.cpu(), ref_v)


@pytest.mark.parametrize("case,match", [
    ("nz", "cache_mode"), ("dup", "unique"), ("range", r"\[0, 511\]"), ("dtype", "dtypes must be equal"),
    ("noncontig", "contiguous"), ("host", "host-side"),
])
def test_cache_write_constraints(case, match):
    k, v = npu(torch.randn(3, 2, 64)), npu(torch.randn(3, 2, 64))
    kc, vc = npu(torch.zeros(4, 128, 2, 64)), npu(torch.zeros(4, 128, 2, 64))
    slots = torch.tensor([1, 2, 3], dtype=torch.int32)
    kw = dict(cache_mode="Norm")
    if case == "nz":
        kw = {}
    elif case == "dup":
        slots = torch.tensor([1, 1, 3], dtype=torch.int32)
    elif case == "range":
        slots = torch.tensor([1, 2, 512], dtype=torch.int32)
    elif case == "dtype":
        k = npu(torch.randn(3, 2, 64, dtype=torch.bfloat16))
    elif case == "noncontig":
        k = npu(torch.randn(3, 64, 2)).transpose(1, 2)
    s = slots if case == "host" else npu(slots)
    with pytest.raises(NPUOpError, match=match):
        torch_npu.npu_scatter_pa_kv_cache(k, v, kc, vc, s, **kw)


def test_scatter_takes_its_documented_keywords_only():
    k, v = npu(torch.randn(3, 2, 64)), npu(torch.randn(3, 2, 64))
    kc, vc = npu(torch.zeros(4, 128, 2, 64)), npu(torch.zeros(4, 128, 2, 64))
    s = npu(torch.tensor([1, 2, 3], dtype=torch.int32))
    with pytest.raises(TypeError, match="compress_seq_offset"):  # the real name is compress_seq_offsets
        torch_npu.npu_scatter_pa_kv_cache(k, v, kc, vc, s, compress_seq_offset=None, cache_mode="Norm")
    with pytest.raises(NPUOpError, match="compress_seq_offsets is not emulated"):
        torch_npu.npu_scatter_pa_kv_cache(k, v, kc, vc, s, compress_seq_offsets=s, cache_mode="Norm")


def test_norms_rotary_swiglu_match_their_formulas():
    g = torch.Generator().manual_seed(2)
    x, r, w = torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g), torch.randn(64, generator=g)
    y, rstd = torch_npu.npu_rms_norm(npu(x), npu(w), 1e-6)
    ref = torch.stack([x[i] / math.sqrt(float((x[i] ** 2).mean()) + 1e-6) * w for i in range(5)])
    assert torch.allclose(y.cpu(), ref, atol=1e-5) and rstd.dtype == torch.float32
    y2, _, s = torch_npu.npu_add_rms_norm(npu(x), npu(r), npu(w), 1e-6)
    assert torch.allclose(s.cpu(), x + r) and torch.allclose(y2.cpu(), torch_npu.npu_rms_norm(npu(x + r), npu(w))[0].cpu())
    # rotate-half rotary == multiplying pairs (x_i, x_{i+D/2}) by e^{i*theta} as complex numbers
    xq = torch.randn(1, 3, 2, 8, generator=g)
    theta = torch.randn(1, 3, 1, 4, generator=g)
    cos, sin = torch.cat([theta.cos()] * 2, -1), torch.cat([theta.sin()] * 2, -1)
    out = torch_npu.npu_rotary_mul(npu(xq), npu(cos), npu(sin)).cpu()
    z = torch.complex(xq[..., :4], xq[..., 4:]) * torch.exp(1j * theta)
    assert torch.allclose(out, torch.cat([z.real, z.imag], -1), atol=1e-6)
    gu = torch.randn(4, 10, generator=g)
    assert torch.allclose(torch_npu.npu_swiglu(npu(gu)).cpu(), gu[:, :5] / (1 + torch.exp(-gu[:, :5])) * gu[:, 5:],
                          atol=1e-6)
    with pytest.raises(NPUOpError, match="4-D"):
        torch_npu.npu_rotary_mul(npu(xq[0]), npu(cos[0]), npu(sin[0]))
    # ops-nn's swi_glu tiling: the split axis even, dim within the axes
    with pytest.raises(NPUOpError, match="split axis of input x must be an even number"):
        torch_npu.npu_swiglu(npu(torch.randn(4, 9, generator=g)))
    with pytest.raises(NPUOpError, match="depends on the number of shape axes"):
        torch_npu.npu_swiglu(npu(gu), dim=2)


def _plain_top_k_top_p(row, k, p):
    n = len(row)
    order = sorted(range(n), key=lambda i: row[i])
    thr = row[order[n - min(k, n)]]
    alive = [i for i in order if row[i] >= thr]
    m = max(row[i] for i in alive)
    z = sum(math.exp(row[i] - m) for i in alive)
    keep, cum = set(), 0.0
    for pos, i in enumerate(alive):
        cum += math.exp(row[i] - m) / z
        if cum > 1 - p or pos == len(alive) - 1:
            keep.add(i)
    return [row[i] if i in keep else -math.inf for i in range(n)]


def test_top_k_top_p_matches_the_documented_algorithm():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, -1.0, 3.0], [0.5, 0.1, 0.2, 0.3, 0.4, 0.0]])
    for k, p in [(1, 1.0), (2, 1.0), (6, 0.5), (3, 0.8), (6, 1.0)]:
        out = torch_npu.npu_top_k_top_p(npu(logits), npu(torch.full((2,), p)), npu(torch.full((2,), k, dtype=torch.int32)))
        for r in range(2):
            assert out.cpu()[r].tolist() == pytest.approx(_plain_top_k_top_p(logits[r].tolist(), k, p))
    out = torch_npu.npu_top_k_top_p(npu(logits), npu(torch.full((2,), 0.5)), None)  # top-p alone: k = None
    for r in range(2):
        assert out.cpu()[r].tolist() == pytest.approx(_plain_top_k_top_p(logits[r].tolist(), 6, 0.5))


def test_top_k_off_is_k_outside_one_to_vocab():
    """aclnnApplyTopKTopP (ops-nn docs and kernel): k <= 0 or k >= vocab means no top-k, and a k above 1024 is the
    k-th value as any other; so one call serves rows with and without top-k."""
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(5, 3000, generator=g) * 3
    k = torch.tensor([0, -3, 3000, 4000, 2000], dtype=torch.int32)
    p = torch.full((5,), 0.9)
    out = torch_npu.npu_top_k_top_p(npu(logits), npu(p), npu(k)).cpu()
    alone_p = torch_npu.npu_top_k_top_p(npu(logits), npu(p), None).cpu()
    assert torch.equal(out[:4], alone_p[:4])  # the rows without top-k: top-p alone
    for r, kk in ((4, 2000),):
        assert out[r].tolist() == pytest.approx(_plain_top_k_top_p(logits[r].tolist(), kk, 0.9))


@pytest.mark.parametrize("p,k,match", [
    (None, "int64", "int32"),
    (None, None, "must not both be None"),
    ([1.5, 0.5], None, r"p must be in \[0, 1\]"),
])
def test_top_k_top_p_enforces_its_documented_ranges(p, k, match):
    logits = npu(torch.randn(2, 6))
    kk = None if k is None else npu(torch.ones(2, dtype=torch.int64) if k == "int64" else torch.tensor(k, dtype=torch.int32))
    pp = None if p is None else npu(torch.tensor(p))
    with pytest.raises(NPUOpError, match=match):
        torch_npu.npu_top_k_top_p(logits, pp, kk)


def test_device_semantics():
    a = npu(torch.ones(3))
    assert a.device.type == "npu" and torch.npu.is_available()
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.ones(3)
    assert torch.equal((a * 2).cpu(), torch.full((3,), 2.0))
    with torch_npu.monitor() as rec:
        a.cpu()
    assert rec == [("d2h", (3,))]


def test_npu_sampler_picks_the_custom_operator_only_when_installed(monkeypatch, tmp_path):
    from rtp_llm.device.npu.ops import NpuOps

    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH", raising=False)
    assert NpuOps().custom_top_k_top_p is None
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(tmp_path))  # set, but rtp_llm/_npu_ops.so is not built here
    ops = NpuOps()
    assert ops.custom_top_k_top_p is None
    logits = npu(torch.tensor([[1.0, 3.0, 2.0, 0.0]]))
    out = ops.top_k_top_p(logits, npu(torch.tensor([2])), None).cpu()  # falls back to npu_top_k_top_p
    assert out.tolist() == [[-math.inf, 3.0, 2.0, -math.inf]]


def test_npu_sampler_filters_every_row_in_one_call_without_a_host_copy(monkeypatch):
    """NpuOps.top_k_top_p hands npu_top_k_top_p every row with its k (vocab = off, above 1024 as asked) in one call,
    and nothing of k, p or the logits goes to the host; every row equals the reference."""
    from rtp_llm.device.npu.ops import NpuOps
    from rtp_llm.device.torch_ops import apply_top_k_top_p

    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH", raising=False)
    ops = NpuOps()
    g = torch.Generator().manual_seed(4)
    vocab = 3000
    logits = torch.randn(5, vocab, generator=g) * 3
    k = torch.tensor([5, vocab, 2000, 1024, vocab])      # top-k, off, past 1024, 1024, off
    p = torch.tensor([0.9, 0.8, 0.7, 0.5, 1.0])
    seen = []
    real = torch_npu.npu_top_k_top_p

    def watched(lg, pp, kk):
        seen.append(lg.shape[0])
        return real(lg, pp, kk)

    monkeypatch.setattr(ops.torch_npu, "npu_top_k_top_p", watched)
    dl, dk, dp = npu(logits), npu(k), npu(p)
    with torch_npu.monitor() as copies:
        out = ops.top_k_top_p(dl, dk, dp)
    assert copies == [] and seen == [5]
    assert torch.equal(out.cpu(), apply_top_k_top_p(logits, k, p))
    seen.clear()
    assert torch.equal(ops.top_k_top_p(npu(logits), None, npu(p)).cpu(), apply_top_k_top_p(logits, None, p))
    assert seen == [5]


def _plain_add_rms_norm_bf16(x1, x2, gamma, eps, normalise_rounded):
    """ops-nn's AddRmsNorm kernels in bfloat16, row by row in float64 where the kernel is float32: the sum in float32
    written rounded; the norm of the rounded sum (SINGLE_N / MERGE_N) or of the float32 sum (NORMAL); x * rstd
    rounded to bf16 before gamma; the product rounded."""
    rows = []
    for a, b in zip(x1, x2):
        total = a.float() + b.float()
        src = total.to(torch.bfloat16).double() if normalise_rounded else total.double()
        rstd = 1.0 / math.sqrt(float((src * src).mean()) + eps)
        rows.append(((src * rstd).to(torch.bfloat16).double() * gamma.double()).to(torch.bfloat16))
    return torch.stack(rows)


@pytest.mark.parametrize("rows,hidden,rounded", [(8, 896, True), (64, 896, True), (8, 2048, True), (64, 2048, False)])
def test_add_rms_norm_rounds_where_the_kernel_its_tiling_picks_rounds(rows, hidden, rounded):
    """bf16 [rows, hidden] on 40 vector cores: 8 rows are one per core (SINGLE_N), 64 rows with hidden <= 2000 go to
    MERGE_N, both normalising the rounded sum; 64 rows of 2048 go to the NORMAL kernel, normalising the float32 sum."""
    from torch_npu._ops import add_rms_norm_mode

    assert (add_rms_norm_mode(rows, hidden) in ("SINGLE_N", "MERGE_N")) == rounded
    g = torch.Generator().manual_seed(rows + hidden)
    x1, x2 = (torch.randn(rows, hidden, generator=g).bfloat16() for _ in range(2))
    gamma = (1 + 0.1 * torch.randn(hidden, generator=g)).bfloat16()
    y, rstd, x = torch_npu.npu_add_rms_norm(npu(x1), npu(x2), npu(gamma), 1e-6)
    assert torch.equal(x.cpu(), (x1.float() + x2.float()).bfloat16())
    want = _plain_add_rms_norm_bf16(x1, x2, gamma, 1e-6, rounded)
    # float32 reduction order against float64: at most one bf16 step apart, and mostly equal
    diff = (y.cpu().float() - want.float()).abs()
    assert bool((diff <= want.float().abs() * 2 ** -7 + 1e-6).all()) and float((diff == 0).float().mean()) > 0.95
    other = _plain_add_rms_norm_bf16(x1, x2, gamma, 1e-6, not rounded)
    assert float((y.cpu() != other).float().mean()) > float((y.cpu() != want).float().mean())


def test_npu_add_rms_norm_keeps_a_row_independent_of_the_batch():
    """The kernel the tiling picks changes with the row count (above 2000 columns in bf16: 40 rows normalise the
    rounded sum, 41 the float32 one), so a row's output would depend on its batch; NpuOps avoids the fused op
    there, and a row gives the same bits alone or in a batch of 64."""
    from rtp_llm.device.npu.ops import NpuOps

    g = torch.Generator().manual_seed(7)
    x, r = (torch.randn(64, 2048, generator=g).bfloat16() for _ in range(2))
    w = (1 + 0.1 * torch.randn(2048, generator=g)).bfloat16()
    fused_alone = torch_npu.npu_add_rms_norm(npu(x[:1]), npu(r[:1]), npu(w), 1e-6)[0].cpu()
    fused_batch = torch_npu.npu_add_rms_norm(npu(x), npu(r), npu(w), 1e-6)[0].cpu()
    assert not torch.equal(fused_alone[0], fused_batch[0])  # the op alone is not batch invariant here
    ops = NpuOps()
    alone, s_alone = ops.add_rms_norm(npu(x[:1]), npu(r[:1]), npu(w), 1e-6)
    batch, s_batch = ops.add_rms_norm(npu(x), npu(r), npu(w), 1e-6)
    assert torch.equal(alone.cpu()[0], batch.cpu()[0]) and torch.equal(s_alone.cpu()[0], s_batch.cpu()[0])
    assert torch.equal(s_batch.cpu(), (x.float() + r.float()).bfloat16())
    small = [ops.add_rms_norm(npu(x[:n, :896]), npu(r[:n, :896]), npu(w[:896]), 1e-6)[0].cpu()[0] for n in (1, 64)]
    assert torch.equal(small[0], small[1])  # 896 columns: the fused op, the rounded sum at every row count
