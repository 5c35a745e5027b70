"""The per-step message rank 0 sends to the other tensor-parallel ranks, and the channel it travels on.

A step is everything a rank needs to run the same forward: each sequence's new tokens, start
position, KV slots and which of its rows need logits (ForwardBatch's LOGITS_*), the block table, and the copy-on-write block
copies to apply first. It is packed into one int64 tensor and broadcast once per step over a gloo
group on the CPU (host metadata; on CUDA/NPU the model's collectives use NCCL/HCCL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Sequence

import numpy as np
import torch

KIND_STEP = 1
KIND_STOP = 2


@dataclass
class StepMessage:
    tokens: list[np.ndarray]
    starts: list[int]
    slots: list[np.ndarray]
    need_logits: list[int]           # per sequence: ForwardBatch.LOGITS_NONE / LOGITS_LAST / LOGITS_ALL
    block_table: np.ndarray          # [B, W] int32
    copies: list[tuple[int, int]]
    loras: list[int] = field(default_factory=list)  # per sequence: its LoRA adapter's id, 0 for none ([]: none at all)
    # (id, name, path) of adapters the other ranks have not been told of: each rank reads its slice from the path
    adapters: list[tuple[int, str, str]] = field(default_factory=list)

    def encode(self) -> np.ndarray:
        b, w = self.block_table.shape
        q_lens = [len(t) for t in self.tokens]
        parts = [np.array([b, w, len(self.copies)], dtype=np.int64), np.asarray(q_lens, dtype=np.int64),
                 np.asarray(self.starts, dtype=np.int64), np.asarray(self.need_logits, dtype=np.int64)]
        parts += [np.asarray(t, dtype=np.int64) for t in self.tokens]
        parts += [np.asarray(s, dtype=np.int64) for s in self.slots]
        parts.append(self.block_table.astype(np.int64).ravel())
        parts.append(np.asarray(self.copies, dtype=np.int64).reshape(-1))
        parts.append(np.asarray(self.loras or [0] * b, dtype=np.int64))
        parts.append(np.array([len(self.adapters)], dtype=np.int64))
        for lora_id, name, path in self.adapters:
            text = [np.frombuffer(s.encode(), dtype=np.uint8).astype(np.int64) for s in (name, path)]
            parts += [np.array([lora_id, len(text[0]), len(text[1])], dtype=np.int64), *text]
        return np.concatenate(parts)

    @classmethod
    def decode(cls, data: np.ndarray) -> "StepMessage":
        b, w, c = (int(x) for x in data[:3])
        at = 3
        q_lens = data[at:at + b]
        starts = data[at + b:at + 2 * b].tolist()
        need = data[at + 2 * b:at + 3 * b].tolist()
        at += 3 * b
        ends = np.cumsum(q_lens)
        total = int(ends[-1]) if b else 0
        flat_tokens = data[at:at + total]
        flat_slots = data[at + total:at + 2 * total]
        at += 2 * total
        table = data[at:at + b * w].astype(np.int32).reshape(b, w)
        at += b * w
        pairs = data[at:at + 2 * c].reshape(c, 2)
        at += 2 * c
        loras = data[at:at + b].tolist()
        at += b
        adapters = []
        for _ in range(int(data[at])):
            lora_id, n_name, n_path = (int(x) for x in data[at + 1:at + 4])
            raw = data[at + 4:at + 4 + n_name + n_path].astype(np.uint8).tobytes()
            adapters.append((lora_id, raw[:n_name].decode(), raw[n_name:].decode()))
            at += 3 + n_name + n_path
        return cls(np.split(flat_tokens, ends[:-1]), starts, np.split(flat_slots, ends[:-1]), need, table,
                   [(int(s), int(d)) for s, d in pairs], loras, adapters)


class StepChannel:
    """Broadcasts variable-length int64 messages from rank 0 with one collective in the common case.

    Every rank holds a buffer of the same capacity; element 0 is the message length, element 1 its kind.
    A message that does not fit (a large prefill step) is announced by a negative length, the new
    capacity, and re-sent in a grown buffer; once messages are back to a small fraction of the buffer
    (decode steps after a prefill) the buffer shrinks the same way, so a decode step does not keep
    broadcasting the largest step's buffer."""

    MIN_CAPACITY = 1024

    def __init__(self, group, capacity: int = MIN_CAPACITY):
        self.group = group
        self.bytes_sent = 0  # broadcast payload, whole buffers (benchmarks)
        self._resize(capacity)

    def _resize(self, capacity: int) -> None:
        self.capacity = capacity
        self.buffer = torch.zeros(capacity, dtype=torch.int64)

    def _broadcast(self) -> None:
        import torch.distributed as dist

        dist.broadcast(self.buffer, 0, group=self.group)
        self.bytes_sent += self.buffer.numel() * 8

    def send(self, kind: int, payload: np.ndarray | Sequence[int] = ()) -> None:
        payload = np.asarray(payload, dtype=np.int64)
        n = len(payload)
        fit = max(self.MIN_CAPACITY, 1 << (n + 2).bit_length())
        if n + 2 > self.capacity or (self.capacity > self.MIN_CAPACITY and fit * 4 <= self.capacity):
            self.buffer[0] = -fit
            self._broadcast()
            self._resize(fit)
        self.buffer[0], self.buffer[1] = n, kind
        self.buffer[2:n + 2] = torch.from_numpy(payload)
        self._broadcast()

    def recv(self) -> tuple[int, np.ndarray]:
        self._broadcast()
        n = int(self.buffer[0])
        if n < 0:
            self._resize(-n)
            self._broadcast()
            n = int(self.buffer[0])
        return int(self.buffer[1]), self.buffer[2:n + 2].numpy().copy()


# Workers wait on the step channel while the server is idle, for as long as it stays idle.
IDLE_TIMEOUT = timedelta(days=3650)
