"""Emulated torch_npu operators: the documented math, computed on the CPU data of npu tensors, and the documented
constraints, raised as the real operators would (messages name the argument).

Sources, cited beside each check as [docs] / [schema] / [atb] / [vllm-ascend]:
- [docs]: the operator docs torch_npu 2.13.0 ships (torch_npu/_op_plugin_docs.py, from op-plugin's
  docs/zh/custom_APIs/torch_npu/*.md), the pairing of the pinned torch 2.13.0;
- [schema]: its schemas (torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml, op-plugin's
  op_plugin_functions.yaml): names, kinds and defaults of every parameter; tests/device/npu/test_torch_npu_api.py
  holds these functions' signatures to them;
- [atb]: the ATB ReshapeAndCache operation doc and torch_npu's AtbOpsInterface.h (_npu_reshape_and_cache);
- [vllm-ascend]: how vllm-ascend calls the operator (attention_v1.py), where the docs leave a case open;
- [aclnn]: CANN's aclnn operator docs (the formula of aclnnWeightQuantBatchMatmulV2);
- [op-plugin]: the op's binding in op-plugin (op_plugin/ops/opapi/*KernelNpuOpApi.cpp): its argument checks;
- [ops-transformer], [ops-nn]: CANN's open operator source (the tiling checks and the kernels' rounding points) at the
  commits rtp_llm/device/npu/versions.py names; where it is stricter than the docs (FIA's TND dtype), it wins.
Where the documents disagree or are silent, the emulator refuses rather than guesses.
"""

from __future__ import annotations

import math


import torch
import torch.nn.functional as F

from torch_npu._device import NPUTensor, inner, wrap

_MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class NPUOpError(RuntimeError):
    """What CANN reports: the operator, the parameter and the rule it broke."""

    def __init__(self, op: str, message: str):
        super().__init__(f"{op}: {message}")


def _on_npu(op: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise NPUOpError(op, f"{name} must be a tensor on the npu device, got {type(t).__name__}")
    if not isinstance(t, NPUTensor):
        raise NPUOpError(op, f"{name} must be on the npu device, but it is on {t.device} (host-side tensor)")
    return inner(t)


def _contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise NPUOpError(op, f"{name} must be contiguous (shape {tuple(t.shape)}, stride {t.stride()})")


def _int_list(op: str, name: str, values) -> list[int]:
    if isinstance(values, torch.Tensor):
        raise NPUOpError(op, f"{name} must be a host list of ints in TND layout, got a tensor")
    return [int(v) for v in values]


def _not_emulated(op: str, **features) -> None:
    """Documented inputs this engine never passes: refused, so a call that starts passing one is noticed here."""
    for name, value in features.items():
        if value is not None:
            raise NPUOpError(op, f"{name} is not emulated (the engine does not use it)")


# --- attention ---------------------------------------------------------------------------------------
# Head dims of the TND layout: 128 is the documented case [docs: "TND ... D = 128"]; 64 is accepted by some CANN
# versions only (older error messages list it): allowed here, flagged as CANN-version dependent in the README.
TND_HEAD_DIMS = (128, 64)


def npu_fused_infer_attention_score(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                                    actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None,
                                    dequant_scale2=None, quant_scale2=None, quant_offset2=None, antiquant_scale=None,
                                    antiquant_offset=None, key_antiquant_scale=None, key_antiquant_offset=None,
                                    value_antiquant_scale=None, value_antiquant_offset=None, block_table=None,
                                    query_padding_size=None, kv_padding_size=None, key_shared_prefix=None,
                                    value_shared_prefix=None, actual_shared_prefix_len=None, query_rope=None,
                                    key_rope=None, key_rope_antiquant_scale=None, num_heads=1, scale=1.0,
                                    pre_tokens=2147483647, next_tokens=2147483647, input_layout="BSH",
                                    num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0,
                                    antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0,
                                    softmax_lse_flag=False):  # [schema] the 2.13 yaml, in its order
    op = "npu_fused_infer_attention_score"
    _not_emulated(op, pse_shift=pse_shift, dequant_scale1=dequant_scale1, quant_scale1=quant_scale1,
                  dequant_scale2=dequant_scale2, quant_scale2=quant_scale2, quant_offset2=quant_offset2,
                  antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                  query_padding_size=query_padding_size, kv_padding_size=kv_padding_size,
                  key_antiquant_scale=key_antiquant_scale, key_antiquant_offset=key_antiquant_offset,
                  value_antiquant_scale=value_antiquant_scale, value_antiquant_offset=value_antiquant_offset,
                  key_shared_prefix=key_shared_prefix, value_shared_prefix=value_shared_prefix,
                  actual_shared_prefix_len=actual_shared_prefix_len, query_rope=query_rope, key_rope=key_rope,
                  key_rope_antiquant_scale=key_rope_antiquant_scale)
    if input_layout != "TND":
        raise NPUOpError(op, f"the emulator implements input_layout 'TND' only, got {input_layout!r}")
    q = _on_npu(op, "query", query)
    k = _on_npu(op, "key", key)
    v = _on_npu(op, "value", value)
    if q.dim() != 3:
        raise NPUOpError(op, f"query must be 3-D [T, N, D] for TND, got {tuple(q.shape)}")
    _contiguous(op, "query", q)
    T, N, D = q.shape
    if q.dtype not in (torch.float16, torch.bfloat16):  # [docs] query: float16, bfloat16, int8
        raise NPUOpError(op, f"query dtype {q.dtype} is not supported: float16 or bfloat16 (no float32)")
    # [ops-transformer] TND with a block table takes the prompt-flash tiling (fused_infer_attention_score_tiling.cpp,
    # usingIFA false), whose CheckInputShapeWhenLayoutIsTND refuses any input dtype but bf16
    if q.dtype != torch.bfloat16:
        raise NPUOpError(op, f"When layout is TND, inputDataType should be bf16 (query is {q.dtype})")
    if not (q.dtype == k.dtype == v.dtype):  # [docs] paged KV in the query's float dtype
        raise NPUOpError(op, f"query/key/value dtypes must be equal, got {q.dtype}, {k.dtype}, {v.dtype}")
    kv_n = num_key_value_heads or num_heads
    if num_heads != N:
        raise NPUOpError(op, f"num_heads={num_heads} but query has {N} heads")
    if N > 256 or num_heads % kv_n or num_heads // kv_n > 64:
        raise NPUOpError(op, f"unsupported head counts: num_heads={num_heads}, num_key_value_heads={kv_n} "
                             "(N <= 256, N % KV_N == 0, N / KV_N <= 64)")
    if D > 512 or (D * q.element_size()) % 16:
        raise NPUOpError(op, f"head dim {D} must be <= 512 and 16-byte aligned")
    if D not in TND_HEAD_DIMS:  # [ops-transformer] CheckInputShapeWhenLayoutIsTND: q/k/v D equal, 64 or 128 (192 not used)
        raise NPUOpError(op, f"When layout is TND, queryD, keyD and valueD must be the same and equal 128/64, got {D}")
    if actual_seq_lengths is None:
        raise NPUOpError(op, "actual_seq_lengths is required for TND")
    q_cum = _int_list(op, "actual_seq_lengths", actual_seq_lengths)
    batch = len(q_cum)
    if batch == 0 or batch > 4096:
        raise NPUOpError(op, f"batch {batch} out of range [1, 4096]")
    if q_cum[-1] != T:
        raise NPUOpError(op, f"actual_seq_lengths must be cumulative and end at T={T}, got last {q_cum[-1]}")
    q_lens = [q_cum[0]] + [b - a for a, b in zip(q_cum, q_cum[1:])]
    if any(x <= 0 for x in q_lens):
        raise NPUOpError(op, f"actual_seq_lengths {q_cum} has an empty sequence (a leading 0, or not increasing)")
    if sparse_mode not in (0, 2, 3):
        raise NPUOpError(op, f"the emulator implements sparse_mode 0, 2, 3, got {sparse_mode}")
    if sparse_mode != 0:
        if atten_mask is None:
            raise NPUOpError(op, f"atten_mask must not be null when sparse_mode={sparse_mode}")
        m = _on_npu(op, "atten_mask", atten_mask)
        if tuple(m.shape) != (2048, 2048) or m.dtype not in _MASK_DTYPES:
            raise NPUOpError(op, f"sparse_mode {sparse_mode} takes the compressed 2048x2048 bool/int8/uint8 mask, "
                                 f"got {tuple(m.shape)} {m.dtype}")
        if not torch.equal(m.to(torch.bool), torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)):
            raise NPUOpError(op, "atten_mask must be the upper-triangular template (1 = masked)")
    if block_table is None:
        raise NPUOpError(op, "the emulator implements the paged-KV path (block_table) only")
    bt = _on_npu(op, "block_table", block_table)
    if bt.dtype != torch.int32:
        raise NPUOpError(op, f"block_table must be int32, got {bt.dtype}")
    if bt.dim() != 2:
        raise NPUOpError(op, f"block_table must be 2-D [batch, max_blocks], got {bt.dim()}-D {tuple(bt.shape)}")
    if bt.shape[0] < batch:
        raise NPUOpError(op, f"block_table has {bt.shape[0]} rows for a batch of {batch}")
    if k.dim() != 3 or v.dim() != 3:
        raise NPUOpError(op, f"paged key/value must be BnBsH (num_blocks, block_size, KV_N*D), got {tuple(k.shape)}")
    _contiguous(op, "key", k)
    _contiguous(op, "value", v)
    nb, bs, h = k.shape
    if h != kv_n * D or tuple(v.shape) != (nb, bs, h):
        raise NPUOpError(op, f"key/value hidden {h} != num_key_value_heads*D = {kv_n * D}")
    if h > 65535:
        raise NPUOpError(op, "KV_N*D > 65535")
    if block_size != bs:
        raise NPUOpError(op, f"block_size={block_size} but the cache blocks hold {bs} tokens")
    if max(q_lens) > 1:
        if bs % 128 or not 128 <= bs <= 512:
            raise NPUOpError(op, f"block_size {bs}: with prefill (Q_S > 1) it must be a multiple of 128 in [128, 512]")
    elif bs > 512 or bs % 16:
        raise NPUOpError(op, f"block_size {bs}: must be a multiple of 16 and <= 512")
    if actual_seq_lengths_kv is None:
        raise NPUOpError(op, "actual_seq_lengths_kv is required with paged KV (block_table)")
    kv_lens = _int_list(op, "actual_seq_lengths_kv", actual_seq_lengths_kv)
    if len(kv_lens) != batch:
        raise NPUOpError(op, f"actual_seq_lengths_kv has {len(kv_lens)} entries, the batch has {batch}")
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        if kl > bt.shape[1] * bs:
            raise NPUOpError(op, f"actual_seq_lengths_kv[{b}]={kl} exceeds the {bt.shape[1]} blocks of its "
                                 "block_table row (cumulative KV lengths?)")
        if kl < ql:
            raise NPUOpError(op, f"actual_seq_lengths_kv[{b}]={kl} is shorter than its {ql} query tokens")

    k_flat = k.view(nb * bs, kv_n, D).float()
    v_flat = v.view(nb * bs, kv_n, D).float()
    out = torch.empty_like(q)
    ratio = num_heads // kv_n
    start = 0
    for b in range(batch):
        ql, kl = q_lens[b], kv_lens[b]
        blocks = bt[b, : (kl + bs - 1) // bs].to(torch.int64)
        if (blocks < 0).any() or (blocks >= nb).any():
            raise NPUOpError(op, f"block_table row {b} references a block outside [0, {nb})")
        slots = (blocks[:, None] * bs + torch.arange(bs)[None, :]).reshape(-1)[:kl]
        kb = k_flat[slots].repeat_interleave(ratio, dim=1)   # [kl, N, D]: q head h uses kv head h // ratio
        vb = v_flat[slots].repeat_interleave(ratio, dim=1)
        qb = q[start: start + ql].float()                    # [ql, N, D]
        scores = torch.einsum("qnd,knd->nqk", qb, kb) * scale
        if ql > 1 and sparse_mode in (2, 3):
            i = torch.arange(ql)[:, None]
            j = torch.arange(kl)[None, :]
            allowed = j <= (i + (kl - ql) if sparse_mode == 3 else i)
            scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start: start + ql] = torch.einsum("nqk,knd->qnd", probs, vb).to(q.dtype)
        start += ql
    lse = torch.zeros(1, dtype=torch.float32)
    return wrap(out), wrap(lse)


# --- cache writes ----------------------------------------------------------------------------------------
def _cache_write(op, key, value, key_cache, value_cache, slots):
    k, v = _on_npu(op, "key", key), _on_npu(op, "value", value)
    kc, vc = _on_npu(op, "key_cache", key_cache), _on_npu(op, "value_cache", value_cache)
    s = _on_npu(op, "slot_mapping", slots)
    for name, t in (("key", k), ("value", v), ("key_cache", kc), ("value_cache", vc)):
        _contiguous(op, name, t)
    if k.dim() != 3 or v.shape != k.shape:
        raise NPUOpError(op, f"key/value must be [T, KV_N, D] and equal, got {tuple(k.shape)} / {tuple(v.shape)}")
    if kc.dim() != 4 or vc.shape != kc.shape or tuple(kc.shape[2:]) != tuple(k.shape[1:]):
        raise NPUOpError(op, f"caches must be ND [num_blocks, block_size, KV_N, D] matching key, got {tuple(kc.shape)}")
    if not (k.dtype == v.dtype == kc.dtype == vc.dtype):
        raise NPUOpError(op, "key, value and cache dtypes must be equal")
    if s.dtype not in (torch.int32, torch.int64) or s.dim() != 1 or s.shape[0] != k.shape[0]:  # [docs]
        raise NPUOpError(op, f"slot_mapping must be int32/int64 [T={k.shape[0]}], got {s.dtype} {tuple(s.shape)}")
    total = kc.shape[0] * kc.shape[1]
    if s.numel() and (int(s.min()) < 0 or int(s.max()) >= total):
        raise NPUOpError(op, f"slot_mapping values must be in [0, {total - 1}]")
    if s.unique().numel() != s.numel():  # [docs] "重复时不保证正确性": refused, not left to chance
        raise NPUOpError(op, "slot_mapping values must be unique")
    kc.view(total, *kc.shape[2:])[s.long()] = k
    vc.view(total, *vc.shape[2:])[s.long()] = v


def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                            compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ"):
    op = "npu_scatter_pa_kv_cache"
    _not_emulated(op, compress_lens=compress_lens, compress_seq_offsets=compress_seq_offsets, seq_lens=seq_lens)
    if cache_mode not in ("Norm", None):  # [docs] None or 'Norm': ND caches; 'PA_NZ' (the default): NZ only
        raise NPUOpError(op, f"cache_mode {cache_mode!r} expects FRACTAL_NZ caches; ND caches "
                             "[num_blocks, block_size, KV_N, D] need cache_mode='Norm'")
    _cache_write(op, key, value, key_cache, value_cache, slot_mapping)


def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    op = "_npu_reshape_and_cache"
    s = _on_npu(op, "slot_indices", slot_indices)
    if s.dtype != torch.int32:  # [atb] ReshapeAndCache: slotmapping int32 ([vllm-ascend] casts before the call)
        raise NPUOpError(op, f"slot_indices must be int32, got {s.dtype}")
    _cache_write(op, key, value, key_cache, value_cache, slot_indices)


# --- norms, rotary, activation ---------------------------------------------------------------------------
def npu_rms_norm(self, gamma, epsilon=1e-6):
    op = "npu_rms_norm"
    xi, g = _on_npu(op, "self", self), _on_npu(op, "gamma", gamma)
    if xi.dtype not in _FLOAT_DTYPES or g.dtype != xi.dtype:  # [docs] float16/bfloat16/float32, gamma = self's
        raise NPUOpError(op, f"self and gamma must share a dtype of float16/bfloat16/float32, got {xi.dtype}, "
                             f"{g.dtype}")
    if g.shape[-1] != xi.shape[-1] or g.dim() != 1:
        raise NPUOpError(op, f"gamma {tuple(g.shape)} must be 1-D over the last dim of self {tuple(xi.shape)}")
    xf = xi.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    y = (g.float() * (xf * rstd)).to(xi.dtype) if xi.dtype != torch.float32 else g * (xf * rstd)
    return wrap(y), wrap(rstd)


# AddRmsNorm's tiling (ops-nn norm/add_rms_norm/op_host/add_rms_norm_tiling.cpp, A2/A3): rows spread over the
# vector cores, block_factor = ceil(rows / cores) rows each; the kernel then is SPLIT_D (hidden > 12096 bf16/fp16),
# SINGLE_N (block_factor 1), MERGE_N (hidden aligned to 16 <= 2000), else NORMAL. Vector-core count: Atlas A2's 910B
# has 40 or 48 (GetCoreNumAiv); the emulator takes 40 unless RTP_NPU_EMULATOR_AIV_CORES says otherwise.
_ADD_RMS_NORM_SMALL_REDUCE = 2000
_ADD_RMS_NORM_SPLIT_D_B16 = 12096


def _aiv_cores() -> int:
    import os

    return int(os.environ.get("RTP_NPU_EMULATOR_AIV_CORES", "40"))


def add_rms_norm_mode(rows: int, hidden: int) -> str:
    """The kernel AddRmsNorm's tiling picks for a bf16/fp16 [rows, hidden] input (names as the tiling's MODE_*)."""
    block_factor = -(-rows // _aiv_cores())
    if hidden > _ADD_RMS_NORM_SPLIT_D_B16:
        return "SPLIT_D"
    if block_factor == 1:
        return "SINGLE_N"
    if -(-hidden // 16) * 16 <= _ADD_RMS_NORM_SMALL_REDUCE:
        return "MERGE_N"
    return "NORMAL"


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):  # [schema] (x1, x2, gamma, epsilon) -> (y, rstd, x)
    """The kernel's rounding points (ops-nn norm/add_rms_norm/op_kernel): bf16 adds in float32 and writes x rounded;
    the NORMAL kernel (add_rms_norm.h) normalises the unrounded float32 sum, SINGLE_N / MERGE_N (add_rms_norm_single_n.h,
    _merge_n.h) the rounded x; x * rstd is rounded to the dtype before gamma, and the product rounded again
    (float16: gamma multiplied in float16). rstd = 1 / sqrt(sum(x^2 / n) + eps) in float32. The reduction's order
    inside a row is not emulated."""
    op = "npu_add_rms_norm"
    a, b = _on_npu(op, "x1", x1), _on_npu(op, "x2", x2)
    g = _on_npu(op, "gamma", gamma)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise NPUOpError(op, "x1 and x2 must have the same shape and dtype")
    if a.dtype not in _FLOAT_DTYPES or g.dtype != a.dtype:  # [docs] gamma in x's dtype
        raise NPUOpError(op, f"x1, x2 and gamma must share a dtype of float16/bfloat16/float32, got {a.dtype}, "
                             f"{g.dtype}")
    if g.dim() != 1 or g.shape[0] != a.shape[-1]:
        raise NPUOpError(op, f"gamma {tuple(g.shape)} must be 1-D over the last dim of x1 {tuple(a.shape)}")
    hidden = a.shape[-1]
    if a.dtype == torch.float32:
        x = a + b
        rstd = torch.rsqrt((x * x * (1.0 / hidden)).sum(-1, keepdim=True) + epsilon)
        return wrap(g * (x * rstd)), wrap(rstd), wrap(x)
    total = a.float() + b.float()
    x = total.to(a.dtype)
    rows = a.numel() // hidden
    mode = add_rms_norm_mode(rows, hidden)
    if mode == "SPLIT_D":
        raise NPUOpError(op, f"hidden {hidden} > {_ADD_RMS_NORM_SPLIT_D_B16} takes the SPLIT_D kernel, which the "
                             "emulator does not implement")
    src = total if (mode == "NORMAL" and a.dtype == torch.bfloat16) else x.float()
    rstd = torch.rsqrt((src * src * (1.0 / hidden)).sum(-1, keepdim=True) + epsilon)
    normed = (src * rstd).to(a.dtype)
    y = (normed.float() * g.float()).to(a.dtype)
    return wrap(y), wrap(rstd), wrap(x)


def npu_rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
    op = "npu_rotary_mul"
    _not_emulated(op, rotate=rotate)
    xi, c, s = _on_npu(op, "self", self), _on_npu(op, "r1", r1), _on_npu(op, "r2", r2)
    if rotary_mode != "half":
        raise NPUOpError(op, f"the emulator implements rotary_mode 'half', got {rotary_mode!r}")
    if xi.dim() != 4 or c.dim() != 4 or s.dim() != 4:  # [docs] 4-D (BNSD, BSND or SBND)
        raise NPUOpError(op, "self, r1 and r2 must be 4-D")
    if c.shape[-1] != xi.shape[-1] or xi.shape[-1] % 2 or xi.shape[-1] >= 896:  # [docs] D < 896, even
        raise NPUOpError(op, f"last dims must match, be even and < 896: self {tuple(xi.shape)}, r1 {tuple(c.shape)}")
    if not (xi.dtype == c.dtype == s.dtype):
        raise NPUOpError(op, f"self, r1 and r2 must share a dtype, got {xi.dtype}, {c.dtype}, {s.dtype}")
    try:
        torch.broadcast_shapes(xi.shape, c.shape, s.shape)
    except RuntimeError:
        raise NPUOpError(op, f"r1/r2 {tuple(c.shape)} do not broadcast to x {tuple(xi.shape)}") from None
    half = xi.shape[-1] // 2
    rot = torch.cat((-xi[..., half:], xi[..., :half]), dim=-1)
    return wrap(xi * c + rot * s)


def npu_swiglu(self, dim=-1):
    op = "npu_swiglu"
    xi = _on_npu(op, "self", self)
    # [ops-nn] swi_glu_tiling.cpp SetTotalShape: dim within the axes; the product of the axes from dim on is even
    if not -xi.dim() <= dim < xi.dim():
        raise NPUOpError(op, f"The value of attribute dim ({dim}) depends on the number of shape axes of input x "
                             f"({xi.dim()})")
    if math.prod(xi.shape[dim % xi.dim():]) % 2:
        raise NPUOpError(op, f"dim {dim} has odd size {xi.shape[dim]}: the split axis of input x must be an even number")
    a, b = xi.chunk(2, dim=dim)
    return wrap(F.silu(a) * b)


# --- sampling --------------------------------------------------------------------------------------------
def npu_top_k_top_p(logits, p=None, k=None):
    """CANN aclnnApplyTopKTopP: sort ascending (stable); top-k keeps values >= sorted[V-k] (ties
    survive; k <= 0 or k >= V: no top-k); top-p on the survivors masks cumsum(softmax) <= 1 - p, always keeping the
    largest."""
    op = "npu_top_k_top_p"
    x = _on_npu(op, "logits", logits)
    if x.dim() != 2 or x.dtype not in _FLOAT_DTYPES:  # [docs] 2-D bfloat16/float16/float32
        raise NPUOpError(op, f"logits must be 2-D float32/float16/bfloat16, got {x.dim()}-D {x.dtype}")
    if p is None and k is None:  # [docs] "不支持p和k同时传None"
        raise NPUOpError(op, "p and k must not both be None")
    batch, vocab = x.shape
    kk = pp = None
    if k is not None:
        kk = _on_npu(op, "k", k)
        if kk.dtype != torch.int32 or kk.dim() != 1 or kk.shape[0] != batch:  # [docs] int32, 1-D, [batch]
            raise NPUOpError(op, f"k must be int32 [batch={batch}], got {kk.dtype} {tuple(kk.shape)}")
        # [ops-nn] aclnnApplyTopKTopP: "k <= 0 or k >= logits.size(1): no top-k" (docs/aclnnApplyTopKTopP.md; the
        # kernel reads the k-th value from global memory for any k), and op-plugin's binding adds no check. torch_npu's
        # own doc says k in [1, 1024]: the operator's source and its binding are what run, so they win here.
    if p is not None:
        pp = _on_npu(op, "p", p)
        if pp.dtype != x.dtype or pp.dim() != 1 or pp.shape[0] != batch:  # [docs] logits' dtype, 1-D, [batch]
            raise NPUOpError(op, f"p must be {x.dtype} [batch={batch}], got {pp.dtype} {tuple(pp.shape)}")
        if pp.numel() and (float(pp.min()) < 0 or float(pp.max()) > 1):  # [docs] p in [0, 1]
            raise NPUOpError(op, f"p must be in [0, 1], got values in [{float(pp.min())}, {float(pp.max())}]")
    if vocab == 1:
        return wrap(x.clone())
    vals, idx = torch.sort(x, dim=-1, stable=True)
    keep = torch.ones_like(vals, dtype=torch.bool)
    if kk is not None:
        on = (kk > 0) & (kk < vocab)
        thr = vals.gather(1, (vocab - torch.where(on, kk, torch.ones_like(kk)).long())[:, None])
        keep &= (vals >= thr) | ~on[:, None]
    if pp is not None:
        masked = vals.float().masked_fill(~keep, float("-inf"))
        cum = torch.softmax(masked, dim=-1).cumsum(-1)
        drop = cum <= (1 - pp.float())[:, None]
        drop[:, -1] = False
        keep &= ~drop
    out = torch.full_like(x, float("-inf"))
    out.scatter_(1, idx, torch.where(keep, vals, torch.full_like(vals, float("-inf"))))
    return wrap(out)


# --- weight-only quantized matmul ------------------------------------------------------------------------
# int32 tensors made by npu_convert_weight_to_int4pack (their storages): the real op interleaves the 8 int4 of each
# int32 in an order its docs do not give ("交叠排放"), so the emulator packs in its own order and
# npu_weight_quant_batchmatmul takes an int32 weight only if it came from here. Callers never read the packed bits.
_INT4_PACKED: set[int] = set()
_MAX_KN = 65535


def npu_convert_weight_to_int4pack(weight, inner_k_tiles=0):
    op = "npu_convert_weight_to_int4pack"
    w = _on_npu(op, "weight", weight)
    if w.dtype != torch.int32 or w.dim() != 2:  # [docs] int32, 2-D (k, n) or (n, k)
        raise NPUOpError(op, f"weight must be a 2-D int32 tensor, got {w.dim()}-D {w.dtype}")
    _contiguous(op, "weight", w)  # [docs] 不支持非连续的Tensor
    if w.shape[-1] % 8:  # [docs] the last dimension aligned to 8 elements
        raise NPUOpError(op, f"the last dimension ({w.shape[-1]}) must be a multiple of 8")
    if w.numel() and (int(w.min()) < -8 or int(w.max()) > 7):  # [docs] values in int4's range [-8, 7]
        raise NPUOpError(op, f"values must be in [-8, 7], got [{int(w.min())}, {int(w.max())}]")
    if inner_k_tiles != 0:  # [docs] reserved, unused
        raise NPUOpError(op, "inner_k_tiles is reserved (0)")
    nib = (w & 0xF).reshape(w.shape[0], -1, 8).to(torch.int64)
    packed = (nib << (4 * torch.arange(8))).sum(-1)
    packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)
    _INT4_PACKED.add(packed.untyped_storage().data_ptr())
    return wrap(packed)


def _unpack_int4(p: torch.Tensor) -> torch.Tensor:
    """The emulator's packing undone: int32 [r, c] -> int [r, 8c] in [-8, 7]."""
    nib = (p.to(torch.int64)[..., None] >> (4 * torch.arange(8))) & 0xF
    return torch.where(nib >= 8, nib - 16, nib).reshape(p.shape[0], -1)


def _transposed(t: torch.Tensor) -> bool:
    """op-plugin's is_transpose_last_two_dims: the (K, N) view of a contiguous (N, K) tensor."""
    return t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous()


def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                 quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                 weight_dtype=None):  # [schema] the 2.13 yaml, in its order
    """[aclnn] aclnnWeightQuantBatchMatmulV2: y = x @ ANTIQUANT(weight) + bias, ANTIQUANT(w) = (w + antiquant_offset)
    * antiquant_scale. The emulator computes ANTIQUANT in float32 and rounds it once to x's dtype (the operand dtype
    of the matrix unit; the docs do not say where the vector unit rounds), sums in float32, rounds the output."""
    op = "npu_weight_quant_batchmatmul"
    _not_emulated(op, quant_scale=quant_scale, quant_offset=quant_offset, weight_dtype=weight_dtype)
    xi, w = _on_npu(op, "x", x), _on_npu(op, "weight", weight)
    scale = _on_npu(op, "antiquant_scale", antiquant_scale)
    if xi.dim() != 2 or w.dim() != 2:  # [docs] x (M, K), weight (K, N): two dims
        raise NPUOpError(op, f"x and weight must be 2-D, got {tuple(xi.shape)} and {tuple(w.shape)}")
    if xi.dtype not in (torch.float16, torch.bfloat16):  # [docs] x: float16, bfloat16
        raise NPUOpError(op, f"x must be float16 or bfloat16, got {xi.dtype}")
    if w.dtype not in (torch.int8, torch.int32):  # [docs] weight: int8, int32 carrying int4
        raise NPUOpError(op, f"weight must be int8 or int32 (int4 packed), got {w.dtype}")
    trans = _transposed(w)
    if not (trans or w.is_contiguous()):  # [docs] ND, or the transposed view of an ND tensor
        raise NPUOpError(op, f"weight must be contiguous or a transposed view (stride {w.stride()})")
    if w.dtype == torch.int32:
        if w.untyped_storage().data_ptr() not in _INT4_PACKED:
            raise NPUOpError(op, "an int32 weight must come from npu_convert_weight_to_int4pack")
        ints = _unpack_int4(w.t() if trans else w)
        ints = ints.t() if trans else ints                   # (K, N): [op-plugin] K = 8 x rows when transposed
    else:
        ints = w.to(torch.int64)
    K, N = ints.shape
    M = xi.shape[0]
    if xi.shape[1] != K:  # [op-plugin] "The k of x and weight should be equal"
        raise NPUOpError(op, f"the k of x ({xi.shape[1]}) and weight ({K}) should be equal")
    if not (1 <= K <= _MAX_KN and 1 <= N <= _MAX_KN) or M < 1:  # [docs] K, N in [1, 65535]; no empty tensors
        raise NPUOpError(op, f"K and N must be in [1, 65535] and M >= 1, got M={M}, K={K}, N={N}")
    g = antiquant_group_size
    if not (g == 0 or (32 <= g <= K - 1 and g % 32 == 0)):  # [docs] [op-plugin] 0, or a multiple of 32 in [32, K-1]
        raise NPUOpError(op, f"antiquant_group_size can be either 0 or a multiple of 32 within the range 32 to "
                             f"weight_k_dim - 1 ({K - 1}), got {g}")
    if inner_precise not in (0, 1):  # [op-plugin]
        raise NPUOpError(op, f"inner_precise only supports 0 or 1, got {inner_precise}")
    if scale.dtype != xi.dtype:  # [docs] float16/bfloat16 scale: x's dtype (int64 scales: not emulated)
        raise NPUOpError(op, f"antiquant_scale must have x's dtype {xi.dtype}, got {scale.dtype}")
    groups = -(-K // g) if g else 0
    shape = tuple(scale.shape)
    if g:  # [docs] per-group: (ceil(K / group), N)
        if shape != (groups, N):
            raise NPUOpError(op, f"per-group antiquant_scale must be (ceil(K/{g}), N) = ({groups}, {N}), got {shape}")
    elif shape not in ((1,), (1, 1), (1, N), (N,)):  # [docs] per-tensor (1,) / (1, 1); per-channel (1, N) / (N,)
        raise NPUOpError(op, f"antiquant_scale must be (1,), (1, 1), (1, N) or (N,) with N={N} when "
                             f"antiquant_group_size is 0, got {shape}")
    offset = None
    if antiquant_offset is not None:
        offset = _on_npu(op, "antiquant_offset", antiquant_offset)
        if tuple(offset.shape) != shape:  # [docs] antiquant_scale and antiquant_offset shapes must agree
            raise NPUOpError(op, f"antiquant_offset {tuple(offset.shape)} must have antiquant_scale's shape {shape}")
        if offset.dtype != scale.dtype:  # [docs] float offsets: the scale's dtype (int32 offsets: not emulated)
            raise NPUOpError(op, f"antiquant_offset must have antiquant_scale's dtype {scale.dtype}, got {offset.dtype}")

    def per_weight(t: torch.Tensor) -> torch.Tensor:  # a scale / offset tensor expanded to (K, N)
        t = t.float().reshape(-1, N) if t.numel() > 1 else t.float().reshape(1, 1)
        return t.repeat_interleave(g, dim=0)[:K] if g else t.expand(K, N)

    deq = ints.float()
    if offset is not None:
        deq = deq + per_weight(offset)
    deq = (deq * per_weight(scale)).to(xi.dtype)
    y = xi.float() @ deq.float()
    if bias is not None:
        b = _on_npu(op, "bias", bias)
        want = torch.float32 if xi.dtype == torch.bfloat16 else torch.float16
        if b.dtype != want:  # [docs] bias float32 with bfloat16 x, float16 with float16 x
            raise NPUOpError(op, f"bias must be {want} with {xi.dtype} x, got {b.dtype}")
        _contiguous(op, "bias", b)  # [docs] 不支持非连续的Tensor
        if tuple(b.shape) not in ((N,), (1, N)):  # [docs] (N,) or (1, N)
            raise NPUOpError(op, f"bias must be (N,) or (1, N) with N={N}, got {tuple(b.shape)}")
        y = y + b.float().reshape(1, N)
    return wrap(y.to(xi.dtype))
