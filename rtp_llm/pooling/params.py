"""PoolingParams: what a pooling request asks of its pooled hidden state (vLLM's PoolingParams)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

TASKS = ("embed", "score", "classify")


@dataclass
class PoolingParams:
    task: str = "embed"                # embed: a vector; score: one number; classify: one per label
    dimensions: Optional[int] = None   # embed: the first N (Matryoshka), renormalised where the model normalises
    normalize: Optional[bool] = None   # embed: L2-normalise; None = as the model defines (PoolerConfig)
    activation: bool = True            # score / classify: sigmoid (one label) or softmax; false = raw logits

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task: {self.task!r} is not one of {', '.join(TASKS)}")
        if self.dimensions is not None and (self.task != "embed" or self.dimensions < 1):
            raise ValueError("dimensions: a positive number of dimensions, for embeddings only")
