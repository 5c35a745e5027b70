"""Graph-mode decode on Ascend: a decode step (one new token per sequence) replayed from an NPU graph captured once
per batch size, instead of launching every layer's operators from Python (eager decode is bound by host launch
overhead on the NPU; vllm-ascend captures by default). Prefill and mixed steps stay eager.

A step of n sequences runs the graph of the smallest captured size B >= n: its static buffers (ids, positions,
slots, block table) take the step's rows, rows n.. are padding (token 0 at position 0, each writing its own slot of
the reserved block 0 and attending one token there; the graph zeroes block 0 again at its end), the fused attention's host lists (cumulative Q lengths, KV
lengths) are handed to the recorded calls with NPUGraph.update (torch_npu 2.13's auto_dispatch_capture: the FIA
handler's actual_seq_lengths / actual_seq_lengths_kv), and the replay writes the logits of all B rows; the step
reads its n. Capture sizes the rotary table for max_model_len, so no replay ever needs a bigger one.
"""

from __future__ import annotations

import logging

import torch

from rtp_llm.device.forward_batch import ForwardBatch

log = logging.getLogger(__name__)

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


class _Captured:
    def __init__(self, size: int, width: int, device):
        self.size = size
        self.ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)
        self.slots = torch.arange(size, dtype=torch.int64, device=device)  # padding rows: slot j of block 0
        self.block_table = torch.zeros(size, width, dtype=torch.int32, device=device)
        self.rows = torch.arange(size, dtype=torch.int64, device=device)
        self.graph = None
        self.logits = None


class NpuDecodeGraphs:
    def __init__(self, model, kv, attn, block_size: int, max_model_len: int, max_batch: int,
                 sizes=DEFAULT_SIZES):
        import torch_npu  # noqa: F401  (torch.npu)

        self.model, self.kv, self.attn = model, kv, attn
        self.block_size, self.max_model_len = block_size, max_model_len
        # padding rows write slots 0..B-1 of block 0, the pool's reserved block
        self.sizes = sorted(s for s in sizes if s <= min(max_batch, block_size)) or [1]
        self.width = -(-max_model_len // block_size)
        self.device = kv.device
        self.captured: dict[int, _Captured] = {}
        self.disabled = ""  # why capture failed: every step eager from then on

    def runs(self, batch: ForwardBatch) -> bool:
        n = len(batch.q_lens)
        return (not self.disabled and n <= self.sizes[-1] and batch.num_tokens == n and int(batch.logits_indices.shape[0]) == n
                and batch.block_table.shape[1] <= self.width and max(batch.kv_lens) <= self.max_model_len)

    def __call__(self, batch: ForwardBatch):
        """float32 logits [n, vocab] of a decode step; None when capture fails (the caller runs it eager)."""
        n = len(batch.q_lens)
        size = next(s for s in self.sizes if s >= n)
        c = self.captured.get(size)
        if c is None:
            try:
                c = self._capture(size)
            except Exception as exc:  # an op that cannot be captured (a host sync): eager from now on, said once
                self.disabled = f"{type(exc).__name__}: {exc}"
                log.warning("npu: decode graphs off, capturing %d sequences failed (%s); decode steps run eager",
                            size, self.disabled)
                return None
        w = batch.block_table.shape[1]
        c.ids[:n].copy_(batch.input_ids)
        c.positions[:n].copy_(batch.positions)
        c.slots[:n].copy_(batch.slot_mapping)
        c.block_table[:n, :w].copy_(batch.block_table)
        if w < self.width:
            c.block_table[:n, w:].zero_()
        if n < size:  # the padding rows again (a previous, larger step may have used them)
            c.ids[n:].zero_()
            c.positions[n:].zero_()
            c.slots[n:].copy_(c.rows[n:])
            c.block_table[n:].zero_()
        kv_lens = list(batch.kv_lens) + [1] * (size - n)
        c.graph.update([{"actual_seq_lengths": list(range(1, size + 1)), "actual_seq_lengths_kv": kv_lens}])
        c.graph.replay()
        return c.logits[:n]

    def _capture(self, size: int) -> _Captured:
        c = _Captured(size, self.width, self.device)
        batch = ForwardBatch(input_ids=c.ids, positions=c.positions, slot_mapping=c.slots, block_table=c.block_table,
                             q_lens=[1] * size, kv_lens=[self.max_model_len] * size, logits_indices=c.rows,
                             block_size=self.block_size)
        pad = self.kv.buffer[:, :, 0]  # the padding block: its K/V read as zeros everywhere else
        with torch.no_grad():
            self.model.compute_logits(self.model(batch, self.kv, self.attn))  # warm-up, eager
            pad.zero_()
            c.graph = torch.npu.NPUGraph()
            with torch.npu.graph(c.graph, auto_dispatch_capture=True):
                c.logits = self.model.compute_logits(self.model(batch, self.kv, self.attn))
                pad.zero_()  # the padding rows' writes undone in every replay
        self.captured[size] = c
        log.info("npu: decode graph captured for %d sequences", size)
        return c
