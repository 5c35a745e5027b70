"""Emulated mixture-of-experts operators (routing, grouped matmul, unpermute): their documented math on the CPU data
of npu tensors and their documented constraints, with the sources tagged as in _ops.py ([docs]: torch_npu 2.13.0's
_op_plugin_docs.py; [schema]: its yaml; [vllm-ascend]: how its all-gather dispatcher calls the op, where the docs
leave a case open; [megatron]: Megatron-LM's permute / unpermute, whose signature and index convention
npu_moe_token_unpermute reproduces and whose convention its doc example follows). Only the cases the engine
uses are emulated; every other documented input is refused by name.

Not verified without hardware: how the kernels order ties in top-k, the order of the token copies within one
expert after routing, and the precision of the unpermute's weighted sum (emulated: float32, rounded once).
"""

from __future__ import annotations

import torch

from torch_npu._device import wrap
from torch_npu._ops import NPUOpError, _not_emulated, _on_npu

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    """[docs] softmax over the last axis, then its top k: (y: the values, x's dtype; expert_idx: int32; row_idx:
    int32, each position's original row, laid out [vllm-ascend] as j * rows + i)."""
    op = "npu_moe_gating_top_k_softmax"
    xi = _on_npu(op, "x", x)
    _not_emulated(op, finished=finished)
    if xi.dim() not in (2, 3):  # [docs] a 2D/3D tensor
        raise NPUOpError(op, f"x must be 2D or 3D, got {tuple(xi.shape)}")
    if xi.dtype not in _FLOATS:  # [docs] float16, bfloat16, float32
        raise NPUOpError(op, f"x dtype {xi.dtype} is not float16, bfloat16 or float32")
    if not 0 < k <= xi.shape[-1] or k > 1024:  # [docs] 0 < k <= x.shape[-1], k <= 1024
        raise NPUOpError(op, f"k = {k} must satisfy 0 < k <= {xi.shape[-1]} (x's last axis) and k <= 1024")
    probs = torch.softmax(xi.float(), dim=-1)
    y, idx = torch.topk(probs, k, dim=-1)
    rows = xi.shape[:-1].numel()
    row_idx = torch.arange(rows * k, dtype=torch.int32).reshape(k, rows).t().reshape(idx.shape)
    return wrap(y.to(xi.dtype)), wrap(idx.to(torch.int32)), wrap(row_idx.contiguous())


def npu_moe_init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1, expert_capacity=-1,
                            expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False,
                            quant_mode=-1, active_expert_range=[], row_idx_type=0, x_dtype=None):
    """[docs] the dropless, unquantized case: x's rows copied once per chosen expert and sorted by expert
    (expanded_x [rows * K, H]); expanded_row_idx (row_idx_type 0, gather): the flat position i * K + j each sorted
    copy came from ([megatron] argsort order, stable); the count of copies per expert in active_expert_range
    (expert_tokens_num_type 1), int64; expanded_scale undefined without scale (zeros here)."""
    op = "npu_moe_init_routing_v2"
    xi = _on_npu(op, "x", x)
    ids = _on_npu(op, "expert_idx", expert_idx)
    _not_emulated(op, scale=scale, offset=offset, x_dtype=x_dtype)
    if xi.dim() != 2 or xi.dtype not in _FLOATS + (torch.int8,):  # [docs] 2D, float16/bfloat16/float32/int8
        raise NPUOpError(op, f"x must be 2D float16/bfloat16/float32/int8, got {xi.dtype} {tuple(xi.shape)}")
    if ids.dim() != 2 or ids.shape[0] != xi.shape[0] or ids.dtype != torch.int32:  # [docs] (NUM_ROWS, K) int32
        raise NPUOpError(op, f"expert_idx must be int32 ({xi.shape[0]}, K), got {ids.dtype} {tuple(ids.shape)}")
    if not 0 < expert_num <= 10240:  # [docs] (0, 10240] outside key_value mode
        raise NPUOpError(op, f"expert_num = {expert_num} must be in (0, 10240]")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= expert_num):  # [docs] ids within the experts
        raise NPUOpError(op, f"expert_idx holds ids outside [0, {expert_num})")
    if drop_pad_mode != 0:  # [docs] only 0 (dropless) is supported
        raise NPUOpError(op, f"drop_pad_mode = {drop_pad_mode}: only 0 is supported")
    if expert_tokens_num_type != 1:  # [docs] only 1 (count) and 2 (key_value); 2 is not emulated
        raise NPUOpError(op, f"expert_tokens_num_type = {expert_tokens_num_type}: only 1 (count) is emulated "
                             "(the documents support 1 and 2)")
    if not expert_tokens_num_flag:  # [docs] only True is supported
        raise NPUOpError(op, "expert_tokens_num_flag must be True")
    if quant_mode != -1:  # [docs] -1 and 1 supported; the dynamic quant (1) is not emulated
        raise NPUOpError(op, f"quant_mode = {quant_mode}: only -1 (no quantization) is emulated")
    if row_idx_type != 0:  # [docs] 0 (gather) and 1 (scatter); vllm-ascend's all-gather path passes 0
        raise NPUOpError(op, f"row_idx_type = {row_idx_type}: only 0 is emulated")
    rng = list(active_expert_range)
    if len(rng) != 2 or not 0 <= rng[0] < rng[1] <= expert_num:  # [docs] [start, end), 0 <= start, end <= num
        raise NPUOpError(op, f"active_expert_range {rng} must be [start, end) with 0 <= start < end <= {expert_num}")
    copies = ids.numel()
    if active_num not in (-1, 0) and active_num < copies:  # [docs] > 0 caps the rows; a cap that drops rows
        raise NPUOpError(op, f"active_num = {active_num} below the {copies} copies is not emulated")
    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)
    active = (flat[order] >= rng[0]) & (flat[order] < rng[1])
    valid = order[active]
    expanded = torch.zeros(copies, xi.shape[1], dtype=xi.dtype)
    expanded[:len(valid)] = xi.index_select(0, valid // ids.shape[1])
    row_idx = torch.full((copies,), -1, dtype=torch.int32)  # [docs] invalid entries are -1 with row_idx_type 0
    row_idx[:len(valid)] = valid.to(torch.int32)
    counts = torch.bincount(flat, minlength=expert_num)[rng[0]:rng[1]].to(torch.int64)
    return wrap(expanded), wrap(row_idx), wrap(counts), wrap(torch.zeros(copies, dtype=torch.float32))


def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None, antiquant_offset=None,
                       per_token_scale=None, group_list=None, activation_input=None, activation_quant_scale=None,
                       activation_quant_offset=None, split_item=0, group_type=None, group_list_type=0, act_type=0,
                       tuning_config=None, output_dtype=None, x_dtype=None, weight_dtype=None, scale_dtype=None,
                       per_token_scale_dtype=None):
    """[docs] group_type 0 with one x [M, K], one weight [G, K, N] and one y [M, N] (split_item 2/3): rows of x in
    consecutive groups (group_list: sizes with group_list_type 1, running totals with 0), group g multiplied by
    weight[g]; float inputs of one dtype, products summed in float32 and rounded to it once."""
    op = "npu_grouped_matmul"
    _not_emulated(op, bias=bias, scale=scale, offset=offset, antiquant_scale=antiquant_scale,
                  antiquant_offset=antiquant_offset, per_token_scale=per_token_scale, activation_input=activation_input,
                  activation_quant_scale=activation_quant_scale, activation_quant_offset=activation_quant_offset,
                  tuning_config=tuning_config, output_dtype=output_dtype, x_dtype=x_dtype, weight_dtype=weight_dtype,
                  scale_dtype=scale_dtype, per_token_scale_dtype=per_token_scale_dtype)
    if group_type != 0 or split_item not in (2, 3):  # [docs] group_type 0 takes only split_item 2 or 3
        raise NPUOpError(op, f"group_type {group_type} / split_item {split_item}: only group_type 0 with "
                             "split_item 2 or 3 is emulated")
    if act_type != 0:  # [docs] activations only in the per-token quantized case
        raise NPUOpError(op, f"act_type = {act_type}: only 0 (no activation) outside per-token quantization")
    if len(x) != 1 or len(weight) != 1:
        raise NPUOpError(op, "only one x and one weight tensor (the single-tensor case) is emulated")
    xi, wi = _on_npu(op, "x[0]", x[0]), _on_npu(op, "weight[0]", weight[0])
    gl = _on_npu(op, "group_list", group_list) if group_list is not None else None
    if xi.dim() != 2 or wi.dim() != 3:  # [docs] weight 3D, x and y 2D in the single-tensor case
        raise NPUOpError(op, f"x must be 2D and weight 3D, got {tuple(xi.shape)} and {tuple(wi.shape)}")
    if xi.dtype not in _FLOATS or wi.dtype != xi.dtype:  # [docs] the unquantized case: one float dtype
        raise NPUOpError(op, f"x {xi.dtype} and weight {wi.dtype} must share float16, bfloat16 or float32")
    if wi.shape[1] != xi.shape[1]:
        raise NPUOpError(op, f"weight {tuple(wi.shape)} does not take x's K = {xi.shape[1]}")
    if xi.shape[1] >= 65536 or wi.shape[2] >= 65536:  # [docs] InnerLimit 65536 on the last axes
        raise NPUOpError(op, "x's and weight's last axes must be below 65536")
    if gl is None or gl.dim() != 1 or gl.dtype != torch.int64:  # [docs] group_list required, int64, 1-D
        raise NPUOpError(op, "group_list must be a 1-D int64 tensor")
    if len(gl) != wi.shape[0] or len(gl) > 1024:  # [docs] one entry per group, at most 1024 groups
        raise NPUOpError(op, f"group_list has {len(gl)} entries for {wi.shape[0]} weight groups (at most 1024)")
    if group_list_type == 1:
        sizes = gl
        if int(sizes.min()) < 0 or int(sizes.sum()) != xi.shape[0]:  # [docs] non-negative, summing to M
            raise NPUOpError(op, f"group sizes {sizes.tolist()} must be non-negative and sum to {xi.shape[0]}")
    elif group_list_type == 0:
        if int(gl.min()) < 0 or bool((gl[1:] < gl[:-1]).any()) or int(gl[-1]) != xi.shape[0]:
            raise NPUOpError(op, f"group_list {gl.tolist()} must be non-decreasing, ending at {xi.shape[0]}")
        sizes = torch.diff(gl, prepend=gl.new_zeros(1))
    else:
        raise NPUOpError(op, f"group_list_type = {group_list_type} must be 0 or 1")
    out = torch.empty(xi.shape[0], wi.shape[2], dtype=xi.dtype)
    start = 0
    for g, n in enumerate(sizes.tolist()):
        out[start:start + n] = (xi[start:start + n].float() @ wi[g].float()).to(xi.dtype)
        start += n
    return [wrap(out)]


def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    """[docs] each sorted copy s goes back to flat position sorted_indices[s] ([megatron] index_copy), positions
    grouped by token (top_k = probs' second axis, else 1), each copy times its prob, summed per token."""
    op = "npu_moe_token_unpermute"
    tok = _on_npu(op, "permuted_tokens", permuted_tokens)
    idx = _on_npu(op, "sorted_indices", sorted_indices)
    pr = _on_npu(op, "probs", probs) if probs is not None else None
    if padded_mode:  # [docs] only padded_mode=False is supported
        raise NPUOpError(op, "padded_mode must be False")
    if tok.dim() != 2 or tok.dtype != torch.bfloat16:  # [docs] 2-D bfloat16
        raise NPUOpError(op, f"permuted_tokens must be 2-D bfloat16, got {tok.dtype} {tuple(tok.shape)}")
    # [docs] int64; its own example and vllm-ascend pass int32
    if idx.dim() != 1 or idx.dtype not in (torch.int64, torch.int32) or len(idx) != tok.shape[0]:
        raise NPUOpError(op, f"sorted_indices must be 1-D int64/int32 of length {tok.shape[0]}")
    top_k = 1
    if pr is not None:
        if pr.dim() != 2 or pr.dtype != torch.bfloat16 or pr.numel() != tok.shape[0]:  # [docs] (tokens, topK) bf16
            raise NPUOpError(op, f"probs must be bfloat16 (tokens, topK) with tokens * topK = {tok.shape[0]}")
        top_k = pr.shape[1]
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= len(idx)):
        raise NPUOpError(op, "sorted_indices must be a permutation of the copies' positions")
    flat = torch.zeros(tok.shape, dtype=torch.float32)
    flat.index_copy_(0, idx.long(), tok.float())
    flat = flat.reshape(-1, top_k, tok.shape[1])
    if pr is not None:
        flat = flat * pr.float().unsqueeze(-1)
    return wrap(flat.sum(dim=1).to(torch.bfloat16))
