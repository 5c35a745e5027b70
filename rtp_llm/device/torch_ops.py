"""TorchOps: every op the model graph and the sampler call, in plain torch. It is what CUDA runs, the reference
each device's kernels are tested against, and their fallback where a kernel does not apply. A device's op set
subclasses it and replaces what it runs faster (device/cpu/ops.py, device/npu/ops.py).

Linear layers (rtp_llm/layers/linear.py) hold a kernel chosen once at load by prepare_linears: a callable
kernel(x, bias) -> x @ W^T (+ bias). Here: torch's own GEMM on the plain weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rtp_llm.device.random import uniform


# --- reference math -----------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 and cast back exactly as the Hugging Face models do."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half (NeoX) RoPE. x [T, heads, head_dim]; cos/sin [T, head_dim]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """top-k then top-p, exactly as torch_npu's npu_top_k_top_p (aclnnApplyTopKTopP) documents it.

    logits [R, V]; k [R] int (>= 1; V or more = off); p [R] float in (0, 1] (1 = off).
    1. stable ascending sort of each row;
    2. top-k: threshold = sorted[V - k]; values below it become -inf (ties at the threshold survive, so more
       than k tokens may remain; k >= V is a no-op);
    3. top-p on the survivors: softmax, cumulative sum in ascending order, mask where the cumulative sum
       <= 1 - p, always keeping the largest;
    4. scatter back: survivors keep their original logits, the rest are -inf.

    The top-p decision is computed in float64 as cumsum(e) <= (1 - p) * sum(e), e = exp(x - max): the softmax
    without its division, in a precision where the summation order cannot move a token across the boundary.
    That is what lets the C++ CPU twin (rtp_llm/cpp/cpu/top_k_top_p.cc), which never sorts the whole
    vocabulary, give bit-identical masks.
    """
    if k is None and p is None:
        return logits
    vocab = logits.shape[-1]
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False, stable=True)
    neg_inf = torch.full((), float("-inf"), dtype=logits.dtype, device=logits.device)
    if k is not None:
        kk = k.to(torch.int64).clamp(1, vocab)
        threshold = sorted_logits.gather(-1, (vocab - kk).unsqueeze(-1))
        sorted_logits = torch.where(sorted_logits < threshold, neg_inf, sorted_logits)
    if p is not None:
        x = sorted_logits.double()
        e = torch.exp(x - x[:, -1:])                 # the largest is last; masked entries give 0
        cum = e.cumsum(dim=-1)
        drop = cum <= (1 - p.double()).unsqueeze(-1) * cum[:, -1:]
        drop[:, -1] = False
        sorted_logits = torch.where(drop, neg_inf, sorted_logits)
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def route(logits: torch.Tensor, top_k: int, renormalize: bool,
          weights_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture-of-experts router's choice: (weights [T, top_k], expert ids [T, top_k] int64) from router logits
    [T, E]: softmax in float32 over every expert, torch.topk's choice and order (ties: torch.topk's), renormalised
    to sum 1 if asked; weights_dtype: what the weights are rounded to before the products (None: float32)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if weights_dtype is None else weights.to(weights_dtype)), ids


def moe_experts(ops, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts) -> torch.Tensor:
    """sum over each token's experts e of weights * experts[e](h), in ascending expert order from zero (as
    transformers adds them); experts: gated MLPs (.gate_up, .down) run by ops.mlp. Tokens are grouped by expert,
    so each routed expert's weights are read once, and an expert no token routes to is not read at all.

    Two ways to the same additions in the same order (the same bits): a step with few rows per expert (decode)
    gathers the routed rows once and adds each token's top_k results after the experts, since there the small ops of
    a gather and a scatter per expert outweigh the experts' own work; a step with many (prefill) gathers and scatters
    per expert, since there the one-gather way's [tokens x top_k, hidden] copies cost more (benchmarks/README.md)."""
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)  # by expert, then by token
    counts = torch.bincount(flat, minlength=len(experts)).tolist()
    if flat.numel() <= 4 * len(experts):
        return _gathered(ops, h, weights, ids, order, counts, experts)
    out = torch.zeros_like(h)
    tokens = order // ids.shape[1]
    scales = weights.flatten()[order].unsqueeze(-1)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = tokens[start:start + count]
        mlp = experts[expert]
        y = ops.mlp(h.index_select(0, rows), mlp.gate_up, mlp.down)
        out.index_add_(0, rows, (y * scales[start:start + count]).to(out.dtype))
        start += count
    return out


def _gathered(ops, h, weights, ids, order, counts, experts) -> torch.Tensor:
    tokens, top_k = ids.shape
    x = h.index_select(0, order // top_k)
    ys, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            mlp = experts[expert]
            ys.append(ops.mlp(x[start:start + count], mlp.gate_up, mlp.down))
            start += count
    y = (torch.cat(ys) if len(ys) > 1 else ys[0]) * weights.flatten()[order].unsqueeze(-1)
    # where each token's entries sit in y, in ascending expert order (its entries' order in the sort)
    where = torch.empty_like(order)
    where[order] = torch.arange(order.numel())
    y = y.to(h.dtype).index_select(0, where.view(tokens, top_k).sort(dim=1).values.flatten()).view(tokens, top_k, -1)
    out = torch.zeros_like(h)
    for j in range(top_k):
        out = out + y[:, j]
    return out


# --- linear kernels -----------------------------------------------------------------------------------------
class TorchLinear:
    """x @ weight^T (+ bias) with torch's GEMM on the plain weight."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)


class TorchHead(TorchLinear):
    """The LM head on the few sampled rows as [V, H] @ [H, R]: the vocabulary matrix is streamed once, which
    torch's CPU GEMM does faster than F.linear's [R, H] @ [H, V] (benchmarks/ARCHIVE.md)."""

    def __call__(self, h: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = (self.weight @ h.t()).t()
        return out if bias is None else out + bias


# --- the op set ---------------------------------------------------------------------------------------------
class TorchOps:
    name = "torch"
    # GGUF block formats whose weights this op set's linear kernels read as stored (Linear.quantized); the
    # loader dequantizes every other one.
    quantized_formats: tuple[str, ...] = ()
    quantized_dtypes: tuple[torch.dtype, ...] = ()  # the model dtypes those kernels take as activations

    def multiplies_quantized(self, fmt: str, dtype: torch.dtype) -> bool:
        """Whether this op set's kernels can multiply a matrix of GGUF format `fmt` as stored in a `dtype` model."""
        return fmt in self.quantized_formats and dtype in self.quantized_dtypes

    def runs_quantized(self, fmt: str, dtype: torch.dtype) -> bool:
        """Whether a GGUF matrix is kept as stored under quantization "auto" (else it is dequantized at load)."""
        return self.multiplies_quantized(fmt, dtype)

    def quantized_embedding(self, quantized, tied_head, like: torch.Tensor):
        """ids -> embedding rows of a QuantizedWeight (rtp_llm/models/quantized.py): its dequantized rows. A device
        whose head (tied_head: the LM head multiplying the same blocks, or None) holds a device form may read that;
        `like`: the (empty) embedding parameter, for the model's dtype and device."""
        if quantized.packed is None:  # the file's blocks copied at load, not during the first request
            _ = quantized.blocks
        if like.dtype == torch.float32:
            return quantized.rows
        return lambda ids: quantized.rows(ids).to(like.dtype)  # as a dense copy in the model's dtype would hold it

    def prepare_linears(self, linears, head) -> None:
        """Called once after the weights are loaded: gives each linear layer (rtp_llm/layers/linear.py) its
        kernel. `linears`: the decoder layers' Linear objects; `head`: the LM head's (tied: the embedding's
        weight; None for a model without one). A device may repack the weights here (CPU: panels or oneDNN's layout)."""
        for lin in linears:
            lin.kernel = TorchLinear(lin.weight)
        if head is not None:  # None: a pooling model without an LM head
            head.kernel = TorchHead(head.weight)

    def fused_layers(self, layers, cfg):
        """A callable running every decoder layer of a step in one call, or None where this op set has none
        (the model then runs its layers one by one). Built once, after prepare_linears."""
        return None

    def prepare_moe(self, block) -> None:
        """Called once per mixture-of-experts block (rtp_llm/layers/moe.py), before prepare_linears: a device may
        take its experts' weights into a grouped kernel's layout here."""

    def route(self, logits: torch.Tensor, top_k: int, renormalize: bool, weights_dtype):
        return route(logits, top_k, renormalize, weights_dtype)

    def moe_experts(self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, block) -> torch.Tensor:
        """The routed experts' weighted sum for each token (block: the SparseMoE, its experts in block.experts)."""
        return moe_experts(self, h, weights, ids, block.experts)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        """(rms_norm(x + residual), x + residual)."""
        s = x + residual
        return rms_norm(s, weight, eps), s

    def rotary(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [T, H, D], k [T, KVH, D]; cos/sin [T, D] (rotate-half)."""
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def lora_pack(self, a_t: torch.Tensor, bt: torch.Tensor, segments=None) -> tuple:
        """An adapter's weights on one linear layer as lora_add takes them: a_t [K, r] (A^T) and bt [r, N]
        ((B * scale)^T) float32; segments: the fused modules' (rank rows, output columns) blocks [(r0, r1, c0, c1)],
        outside which bt is zero (a device may skip the zeros)."""
        return a_t, bt

    def lora_add(self, x: torch.Tensor, y: torch.Tensor, groups) -> None:
        """LoRA deltas into y in place: for each (rows or None = every row, *lora_pack's weights) group,
        y[rows] += (x[rows] @ a_t) @ bt in float32, rounded once to y's dtype."""
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        for rows, a_t, bt in groups:
            xs = x2 if rows is None else x2.index_select(0, rows)
            ys = y2 if rows is None else y2.index_select(0, rows)
            new = (ys.float() + (xs.float() @ a_t) @ bt).to(y.dtype)
            if rows is None:
                y2.copy_(new)
            else:
                y2.index_copy_(0, rows, new)

    def mlp(self, h: torch.Tensor, gate_up, down) -> torch.Tensor:
        """The gated MLP down(silu(gate) * up) over the Linear layers gate_up and down; one op so that a device
        may fuse the activation into gate_up's kernel or run the rows in pieces."""
        return down(self.silu_and_mul(gate_up(h)))

    def greedy_tokens(self, h: torch.Tensor, head) -> torch.Tensor:
        """argmax of head(h) per row (ties: the lowest id), for steps whose sampled rows are all greedy with
        nothing that reshapes their logits. A device may find it without every logit."""
        return head(h).float().argmax(dim=-1)

    def top_k_top_p(self, logits: torch.Tensor, k, p) -> torch.Tensor:
        return apply_top_k_top_p(logits, k, p)

    def exponential_race(self, probs: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """The sampler's draw: per row argmax of probs / E, E = -log(U) with U the counter-based uniform of (seed,
        step, token) (device/random.py), which selects token i with probability p_i; tokens of probability 0
        score 0. U rounds to exactly 1.0 in float32 about once in 2^24 draws: E = -0 and the token scores -inf."""
        race = probs / -torch.log(uniform(seeds, steps, probs.shape[-1]))
        return torch.where(probs > 0, race, 0.0).argmax(dim=-1)
