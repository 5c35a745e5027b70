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
    """One base Linear's adapters by slot: (first output column, A [r, in], B [out_part, r], scale) per module it
    fuses (qkv holds q, k and v; gate_up gate and up)."""

    def __init__(self, ctx: LoRAContext, offsets: list[int]):
        self.ctx = ctx
        self.offsets = offsets  # where each fused module's output starts
        self.slots: dict[int, list[tuple[int, torch.Tensor, torch.Tensor, float]]] = {}

    @property
    def active(self) -> bool:
        return self.ctx.active

    def install(self, slot: int, parts: list[Optional[tuple[torch.Tensor, torch.Tensor, float]]], device) -> None:
        """parts[i]: the adapter's (A, B, scale) for fused module i, or None where it has none. Kept in float32,
        as PEFT keeps an adapter on a bf16 base (autocast_adapter_dtype)."""
        kept = [(self.offsets[i], a.to(device, torch.float32), b.to(device, torch.float32), scale)
                for i, p in enumerate(parts) if p is not None for a, b, scale in [p]]
        if kept:
            self.slots[slot] = kept
        else:
            self.slots.pop(slot, None)

    def remove(self, slot: int) -> None:
        self.slots.pop(slot, None)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for slot, rows in self.ctx.groups:
            parts = self.slots.get(slot)
            if not parts:
                continue
            xs = x.index_select(0, rows).float().unsqueeze(1)  # [m, 1, in]
            m = xs.shape[0]
            for start, a, b, scale in parts:
                shrink = torch.bmm(xs, a.t().unsqueeze(0).expand(m, -1, -1))   # [m, 1, r]
                expand = torch.bmm(shrink, b.t().unsqueeze(0).expand(m, -1, -1))  # [m, 1, out_part]
                delta = (expand.squeeze(1) * scale).to(y.dtype)
                y[:, start:start + delta.shape[1]].index_add_(0, rows, delta)
        return y
