"""top-k then top-p, exactly as torch_npu's npu_top_k_top_p (aclnnApplyTopKTopP) documents it.

1. stable ascending sort of each row;
2. top-k: threshold = sorted[V - k]; values below it become -inf (ties at the threshold survive,
   so more than k tokens may remain; k >= V is a no-op);
3. top-p on the survivors: softmax, cumulative sum in ascending order, mask where the cumulative
   sum <= 1 - p, always keeping the largest;
4. scatter back: survivors keep their original logits, the rest are -inf.

The top-p decision is computed in float64 as cumsum(e) <= (1 - p) * sum(e), e = exp(x - max): the
softmax without its division, in a precision where the summation order cannot move a token across
the boundary. That is what lets the C++ CPU twin (rtp_llm/cpp/ops/top_k_top_p.cc), which never sorts
the whole vocabulary, give bit-identical masks.
"""

from __future__ import annotations

import torch


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """logits [R, V]; k [R] int (>= 1; V or more = off); p [R] float in (0, 1] (1 = off)."""
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
