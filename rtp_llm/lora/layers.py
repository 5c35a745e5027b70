"""The adapters' deltas on the base layers. A step's rows are grouped by adapter (LoRAContext.groups, set by the
runner); each LoRA-carrying Linear adds, for each group, B (A x) * scale to its rows' slice of the output (the
Punica shrink / expand, per group) through the device's lora_add. Rows of no adapter are not touched."""

from __future__ import annotations

from typing import Optional

import torch


class LoRAContext:
    """The current step's rows per resident adapter slot: [(slot, row indices)], empty when no row has one."""

    def __init__(self):
        self.groups: list[tuple[int, torch.Tensor]] = []
        self.installs = 0  # counts installs and removals: a fused step's cached kernel lists are stale when it moves

    @property
    def active(self) -> bool:
        return bool(self.groups)


class LinearLoRA:
    """One base Linear's adapters by slot. The modules it fuses (qkv: q, k, v; gate_up: gate, up) are joined when
    packed (pack): a_t [in, sum r] holds their A^T side by side, bt [sum r, out] places each (B * scale)^T in its rank
    rows and its output columns (zeros elsewhere: each module's block is a segment the device's lora_pack may keep
    alone), so a group's delta is one shrink and one expand whatever the fusion. Both float32, as PEFT keeps
    adapters on a bf16 base; the device's lora_add computes every group's rows (each row on its own, so a
    row's delta is the same bits in any batch), and the CPU's fused decoder layers call the same kernel."""

    def __init__(self, ctx: LoRAContext, offsets: list[int], out_features: int, ops):
        self.ctx = ctx
        self.offsets = offsets  # where each fused module's output starts
        self.out_features = out_features
        self.ops = ops
        self.slots: dict[int, tuple] = {}  # slot -> the adapter's weights as the device's lora_pack made them

    @property
    def active(self) -> bool:
        return self.ctx.active

    def pack(self, parts: list[Optional[tuple[torch.Tensor, torch.Tensor, float]]]) -> Optional[tuple]:
        """An adapter's weights on this layer as the device's lora_add takes them (on the host; None: no module of
        it adapted). parts[i]: the adapter's (A, B, scale) for fused module i, or None where it has none."""
        given = [(self.offsets[i], a, b, scale) for i, p in enumerate(parts) if p is not None for a, b, scale in [p]]
        if not given:
            return None
        a_all = torch.cat([a for _, a, _, _ in given]).float().contiguous()
        bt_all = torch.zeros(a_all.shape[0], self.out_features, dtype=torch.float32)
        row, segments = 0, []
        for start, a, b, scale in given:
            bt_all[row:row + a.shape[0], start:start + b.shape[0]] = (b.float() * scale).t()
            segments.append((row, row + a.shape[0], start, start + b.shape[0]))
            row += a.shape[0]
        return self.ops.lora_pack(a_all.t().contiguous(), bt_all, segments)

    def install(self, slot: int, packed: Optional[tuple], device) -> None:
        self.ctx.installs += 1
        if packed is None:
            self.slots.pop(slot, None)
        else:
            self.slots[slot] = tuple(t.to(device) for t in packed)

    def remove(self, slot: int) -> None:
        self.ctx.installs += 1
        self.slots.pop(slot, None)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        groups = [(None if rows.numel() == x.shape[0] else rows, *self.slots[slot])
                  for slot, rows in self.ctx.groups if slot in self.slots]
        if groups:
            self.ops.lora_add(x, y, groups)
        return y
