"""The adapters' deltas on the base layers. A step's rows are grouped by adapter (LoRAContext.groups, set by the
runner); each LoRA-carrying Linear adds, for each group, B (A x) * scale to its rows' slice of the output (the
Punica shrink / expand, per group). Rows of no adapter are not touched."""

from __future__ import annotations

from typing import Optional

import torch

from rtp_llm.layers.linear import Linear


class LoRAContext:
    """The current step's rows per resident adapter slot: [(slot, row indices)], empty when no row has one."""

    def __init__(self):
        self.groups: list[tuple[int, torch.Tensor]] = []
        self.installs = 0  # counts installs and removals: a fused step's cached kernel lists are stale when it moves

    @property
    def active(self) -> bool:
        return bool(self.groups)


class LinearLoRA:
    """One base Linear's adapters by slot. The modules it fuses (qkv: q, k, v; gate_up: gate, up) are joined at
    install: A_all [sum r, in] stacks their A, B_all [out, sum r] places each B * scale in its output rows and its
    rank columns (zeros elsewhere), so a group's delta is two products whatever the fusion. Both run on linear
    kernels the device prepares like the base layers' (float32, as PEFT keeps adapters on a bf16 base), whose rows
    are computed independently: a row's delta is the same bits in any batch."""

    def __init__(self, ctx: LoRAContext, offsets: list[int], out_features: int, ops):
        self.ctx = ctx
        self.offsets = offsets  # where each fused module's output starts
        self.out_features = out_features
        self.ops = ops
        self.slots: dict[int, tuple[Linear, Linear]] = {}  # slot -> (shrink: A_all, expand: B_all)

    @property
    def active(self) -> bool:
        return self.ctx.active

    def install(self, slot: int, parts: list[Optional[tuple[torch.Tensor, torch.Tensor, float]]], device) -> None:
        """parts[i]: the adapter's (A, B, scale) for fused module i, or None where it has none."""
        given = [(self.offsets[i], a, b, scale) for i, p in enumerate(parts) if p is not None for a, b, scale in [p]]
        self.ctx.installs += 1
        if not given:
            self.slots.pop(slot, None)
            return
        a_all = torch.cat([a for _, a, _, _ in given]).float()
        b_all = torch.zeros(self.out_features, a_all.shape[0], dtype=torch.float32)
        col = 0
        for start, a, b, scale in given:
            b_all[start:start + b.shape[0], col:col + a.shape[0]] = b.float() * scale
            col += a.shape[0]
        shrink = Linear(a_all.shape[1], a_all.shape[0], False, torch.float32, device)
        expand = Linear(b_all.shape[1], b_all.shape[0], False, torch.float32, device)
        shrink.weight.data.copy_(a_all)
        expand.weight.data.copy_(b_all)
        self.ops.prepare_linears([shrink, expand], None)
        self.slots[slot] = (shrink, expand)

    def remove(self, slot: int) -> None:
        self.ctx.installs += 1
        self.slots.pop(slot, None)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        rows_total = x.shape[0]
        for slot, rows in self.ctx.groups:
            pair = self.slots.get(slot)
            if pair is None:
                continue
            shrink, expand = pair
            whole = rows.numel() == rows_total  # every row of the step: no gather, no scatter
            xs = (x if whole else x.index_select(0, rows)).float()
            delta = expand(shrink(xs)).to(y.dtype)
            if whole:
                y.add_(delta)
            else:
                y.index_put_((rows,), delta, accumulate=True)
        return y
