"""The emulator's npu_weight_quant_batchmatmul and npu_convert_weight_to_int4pack against a plain float64
computation of the documented formula, y = x @ ((w + antiquant_offset) * antiquant_scale) + bias ([aclnn]), and the
documented constraints each must enforce ([docs] torch_npu 2.13's npu_weight_quant_batchmatmul page, [op-plugin]
its binding's checks)."""

import pytest
import torch

from tests.npu_emulator.install import install

torch_npu = install()
from torch_npu._ops import NPUOpError  # noqa: E402

torch.npu.set_device(0)
NPU = torch.device("npu", 0)


def npu(t):
    return t.to(NPU)


def host(t):
    return t.to("cpu")


def plain(x, w_kn, scale_kn, offset_kn, bias=None):
    """float64 reference with ANTIQUANT rounded to x's dtype (the emulator's stated rounding point)."""
    deq = (w_kn.double() + (0 if offset_kn is None else offset_kn.double())) * scale_kn.double()
    y = x.double() @ deq.to(x.dtype).double()
    return y if bias is None else y + bias.double()


def operands(m, k, n, dtype, bits=8, groups=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g)).to(dtype)
    lo, hi = (-8, 8) if bits == 4 else (-128, 128)
    w_nk = torch.randint(lo, hi, (n, k), generator=g, dtype=torch.int8)
    rows = groups or 1
    scale = (torch.rand(n, rows, generator=g) * 0.02 + 0.001).to(dtype)
    offset = (torch.randn(n, rows, generator=g) * 3).to(dtype)
    return x, w_nk, scale, offset


def expand(t_n_g, k, group):
    """[N, groups] -> (K, N), each group's value over its `group` rows of K."""
    return t_n_g.t().repeat_interleave(group, dim=0)[:k] if group else t_n_g.t().expand(k, -1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", [0, 32, 64])
def test_matches_the_documented_formula(dtype, bits, group):
    m, k, n = 5, 192, 40
    groups = -(-k // group) if group else 1
    x, w_nk, scale, offset = operands(m, k, n, dtype, bits, groups, seed=bits + group)
    w = npu(w_nk)
    if bits == 4:
        w = torch_npu.npu_convert_weight_to_int4pack(npu(w_nk.to(torch.int32)))
        assert tuple(w.shape) == (n, k // 8) and w.dtype == torch.int32  # [docs] (n, k/8) int32
    bias = torch.randn(n).to(torch.float32 if dtype == torch.bfloat16 else torch.float16)
    y = torch_npu.npu_weight_quant_batchmatmul(npu(x), w.t(), npu(scale).t(), npu(offset).t(), bias=npu(bias),
                                               antiquant_group_size=group)
    assert y.device.type == "npu" and y.dtype == dtype and tuple(y.shape) == (m, n)
    ref = plain(x, w_nk.t(), expand(scale, k, group), expand(offset, k, group), bias)
    tol = 2.0 ** (-7 if dtype == torch.bfloat16 else -10)
    assert torch.allclose(host(y).double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_per_tensor_and_no_offset_and_plain_layout():
    m, k, n = 3, 64, 16
    x, w_nk, scale, _ = operands(m, k, n, torch.float16)
    s = scale[:1, 0]  # (1,): per-tensor
    y = torch_npu.npu_weight_quant_batchmatmul(npu(x), npu(w_nk.t().contiguous()), npu(s))
    ref = plain(x, w_nk.t(), s.reshape(1, 1).expand(k, n), None)
    assert torch.allclose(host(y).double(), ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())


def test_int4pack_round_trips_through_the_matmul_exactly():
    """Packed int4 and the same integers as int8 give identical results: the packing loses nothing."""
    x, w_nk, scale, offset = operands(4, 64, 24, torch.bfloat16, bits=4, groups=2)
    args = dict(antiquant_group_size=32)
    a = torch_npu.npu_weight_quant_batchmatmul(npu(x), npu(w_nk).t(), npu(scale).t(), npu(offset).t(), **args)
    packed = torch_npu.npu_convert_weight_to_int4pack(npu(w_nk.to(torch.int32)))
    b = torch_npu.npu_weight_quant_batchmatmul(npu(x), packed.t(), npu(scale).t(), npu(offset).t(), **args)
    assert torch.equal(host(a), host(b))


def call(x, w, scale, offset=None, **kw):
    return torch_npu.npu_weight_quant_batchmatmul(npu(x), w, npu(scale), None if offset is None else npu(offset),
                                                  **kw)


@pytest.mark.parametrize("case, match", [
    ("group16", "antiquant_group_size can be either 0 or a multiple of 32"),
    ("group_k", "antiquant_group_size can be either 0 or a multiple of 32"),
    ("scale_dtype", "antiquant_scale must have x's dtype"),
    ("group_shape", "per-group antiquant_scale must be"),
    ("channel_shape", "when antiquant_group_size is 0"),
    ("offset_shape", "antiquant_offset .* must have antiquant_scale's shape"),
    ("offset_dtype", "antiquant_offset must have antiquant_scale's dtype"),
    ("x_fp32", "x must be float16 or bfloat16"),
    ("k_mismatch", "the k of x"),
    ("big_n", "K and N must be in"),
    ("int32_unpacked", "must come from npu_convert_weight_to_int4pack"),
    ("bias_dtype", "bias must be torch.float32 with torch.bfloat16 x"),
    ("bias_shape", "bias must be"),
    ("quant_scale", "quant_scale is not emulated"),
    ("weight_dtype", "weight_dtype is not emulated"),
    ("inner_precise", "inner_precise"),
    ("strided", "contiguous or a transposed view"),
])
def test_documented_constraints_are_enforced(case, match):
    m, k, n = 2, 64, 8
    x, w_nk, scale, offset = operands(m, k, n, torch.bfloat16, groups=2)
    w = npu(w_nk).t()
    s, o = scale.t(), offset.t()  # (2, N): per-group with group 32
    kw = dict(antiquant_group_size=32)
    if case == "group16":
        kw["antiquant_group_size"] = 16
    elif case == "group_k":
        kw["antiquant_group_size"] = 64  # must be <= K - 1
    elif case == "scale_dtype":
        s, o = s.half(), o.half()
    elif case == "group_shape":
        s, o = s[:1], o[:1]
    elif case == "channel_shape":
        kw["antiquant_group_size"] = 0
    elif case == "offset_shape":
        o = o[:1]
    elif case == "offset_dtype":
        o = o.float()
    elif case == "x_fp32":
        x = x.float()
    elif case == "k_mismatch":
        x = x[:, :32]
    elif case == "big_n":
        w = npu(torch.zeros(65536, k, dtype=torch.int8)).t()
        s = o = torch.ones(2, 65536, dtype=torch.bfloat16)
    elif case == "int32_unpacked":
        w = npu(torch.zeros(n, k // 8, dtype=torch.int32)).t()
    elif case == "bias_dtype":
        kw["bias"] = npu(torch.zeros(n, dtype=torch.bfloat16))
    elif case == "bias_shape":
        kw["bias"] = npu(torch.zeros(n + 1))
    elif case == "quant_scale":
        kw["quant_scale"] = npu(torch.ones(n))
    elif case == "weight_dtype":
        kw["weight_dtype"] = 1
    elif case == "inner_precise":
        kw["inner_precise"] = 2
    elif case == "strided":
        w = npu(torch.zeros(k, 2 * n, dtype=torch.int8))[:, ::2]
    with pytest.raises(NPUOpError, match=match):
        call(x, w, s, o, **kw)


@pytest.mark.parametrize("case, match", [
    ("range", r"values must be in \[-8, 7\]"),
    ("align", "multiple of 8"),
    ("dtype", "2-D int32"),
    ("strided", "contiguous"),
])
def test_int4pack_constraints(case, match):
    w = torch.zeros(4, 16, dtype=torch.int32)
    if case == "range":
        w[0, 0] = 8
    elif case == "align":
        w = torch.zeros(4, 12, dtype=torch.int32)
    elif case == "dtype":
        w = w.to(torch.int8)
    w = npu(w)
    if case == "strided":
        w = w.t()
    with pytest.raises(NPUOpError, match=match):
        torch_npu.npu_convert_weight_to_int4pack(w)
