"""The KV buffer: one tensor per engine, viewed per layer without copies.

Layout: [num_layers, 2, num_blocks, block_size, kv_heads, head_dim]. Layer i's view is
buffer[i] = [2, num_blocks, block_size, kv_heads, head_dim], with K = view[0] and V = view[1], each
contiguous. That is the ND layout torch_npu's cache writes take and, viewed as
[num_blocks, block_size, kv_heads * head_dim], the BnBsH layout its fused attention reads; CPU and
CUDA backends use the same views. Nothing ever permutes or copies the cache per call.
"""

from __future__ import annotations

from typing import Iterable

import torch


class KVBuffer:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        zeros=None,
    ):
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("block_size", block_size),
                            ("kv_heads", kv_heads), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"KVBuffer: {name} must be >= 1, got {value}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        # Zeroed so the padding block (0) and never-written slots read as zeros, not garbage/NaN. `zeros(shape,
        # dtype)` is the device's allocator for large long-lived buffers (Device.zeros; CPU: on huge pages).
        shape = (num_layers, 2, num_blocks, block_size, kv_heads, head_dim)
        self.buffer = zeros(shape, dtype) if zeros is not None else torch.zeros(shape, dtype=dtype, device=device)
        self._layers = [self.buffer[i] for i in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one block takes across all layers, K and V."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return num_layers * 2 * block_size * kv_heads * head_dim * itemsize

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def layer(self, i: int) -> torch.Tensor:
        """[2, num_blocks, block_size, kv_heads, head_dim] view of layer i (K = [0], V = [1])."""
        return self._layers[i]

    def copy_blocks(self, copies: Iterable[tuple[int, int]]) -> None:
        """Performs copy-on-write block copies (src -> dst) in every layer, K and V, in one indexed copy."""
        copies = list(copies)
        if not copies:
            return
        src = torch.tensor([c[0] for c in copies], dtype=torch.long).to(self.buffer.device)
        dst = torch.tensor([c[1] for c in copies], dtype=torch.long).to(self.buffer.device)
        self.buffer[:, :, dst] = self.buffer[:, :, src]
