"""The adapters' deltas on the base layers. A step's rows are grouped by adapter (LoRAContext.groups, set by the
runner); each LoRA-carrying Linear adds, for each group, B (A x) * scale to its rows' slice of the output (the
Punica shrink / expand, per group). Rows of no adapter are not touched. Every row's delta is a [1, in] x [in, r]
and [1, r] x [r, out] product of its own (a batched matmul over the group's rows), so it does not depend on how
many rows share the adapter: a row's output is the same bits alone or in any batch."""

from __future__ import annotations

from typing import Optional

import torch


class LoRAContext:
    """The current step's rows per resident adapter slot: [(slot, row indices)], empty when no row has one."""

    def __init__(self):
        self.groups: list[tuple[int, torch.Tensor]] = []

    @property
    def active(self) -> bool:
        return bool(self.groups)


class LinearLoRA:
    """One base Linear's adapters by slot. The modules it fuses (qkv: q, k, v; gate_up: gate, up) are joined at
    install: A_all [sum r, in] stacks their A, B_all [out, sum r] places each B * scale in its output rows and its
    rank columns (zeros elsewhere), so a group's delta is two products whatever the fusion."""

    def __init__(self, ctx: LoRAContext, offsets: list[int], out_features: int):
        self.ctx = ctx
        self.offsets = offsets  # where each fused module's output starts
        self.out_features = out_features
        self.slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # slot -> (A_all^T [in, R], B_all^T [R, out])

    @property
    def active(self) -> bool:
        return self.ctx.active

    def install(self, slot: int, parts: list[Optional[tuple[torch.Tensor, torch.Tensor, float]]], device) -> None:
        """parts[i]: the adapter's (A, B, scale) for fused module i, or None where it has none. Kept in float32,
        as PEFT keeps an adapter on a bf16 base (autocast_adapter_dtype)."""
        given = [(self.offsets[i], a, b, scale) for i, p in enumerate(parts) if p is not None for a, b, scale in [p]]
        if not given:
            self.slots.pop(slot, None)
            return
        a_all = torch.cat([a for _, a, _, _ in given]).float()
        b_all = torch.zeros(self.out_features, a_all.shape[0], dtype=torch.float32)
        col = 0
        for start, a, b, scale in given:
            b_all[start:start + b.shape[0], col:col + a.shape[0]] = b.float() * scale
            col += a.shape[0]
        self.slots[slot] = (a_all.t().contiguous().to(device), b_all.t().contiguous().to(device))

    def remove(self, slot: int) -> None:
        self.slots.pop(slot, None)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        rows_total = x.shape[0]
        for slot, rows in self.ctx.groups:
            weights = self.slots.get(slot)
            if weights is None:
                continue
            a_t, b_t = weights
            whole = rows.numel() == rows_total  # every row of the step: no gather, no scatter
            xs = (x if whole else x.index_select(0, rows)).float().unsqueeze(1)  # [m, 1, in]
            m = xs.shape[0]
            shrink = torch.bmm(xs, a_t.unsqueeze(0).expand(m, -1, -1))         # [m, 1, R]
            delta = torch.bmm(shrink, b_t.unsqueeze(0).expand(m, -1, -1)).squeeze(1).to(y.dtype)  # [m, out]
            if whole:
                y.add_(delta)
            else:
                y.index_add_(0, rows, delta)
        return y
