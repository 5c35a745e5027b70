"""Checkpoint tensors that are read only when (and as much as) the model asks.

Under tensor parallelism each rank reads just its slice of a weight: safetensors slices come straight
from the memory-mapped file; other formats (GGUF, pickle) are already whole tensors and are narrowed.
"""

from __future__ import annotations

from typing import Optional, Union

import torch


class LazyTensor:
    """A safetensors entry: its shape now, its data (whole or one slice along one dim) on read."""

    def __init__(self, handle_slice):
        self._slice = handle_slice
        self.shape = tuple(handle_slice.get_shape())

    def read(self, dim: Optional[int] = None, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        if dim is None:
            return self._slice[:]
        return self._slice[(slice(None),) * dim + (slice(start, stop),)]


def read_tensor(t: Union[torch.Tensor, LazyTensor], piece: Optional[tuple[int, int, int]] = None) -> torch.Tensor:
    """The whole tensor, or piece = (dim, start, stop) of it."""
    if isinstance(t, torch.Tensor):
        return t if piece is None else t.narrow(piece[0], piece[1], piece[2] - piece[1])
    return t.read() if piece is None else t.read(*piece)
