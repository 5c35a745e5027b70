"""The benchmark workloads, defined once for every engine.

W:  32 prompts of exactly 128 tokens, 128 new tokens each, greedy, EOS ignored, all submitted at once.
B1: one 128-token prompt, 128 new tokens.
B8: 8 prompts of 128 tokens, 128 new tokens each: a small server's batch (decode steps of 5-8 rows, where the
    kernels switch from the few-row path to the panel path).
B1L: one 1920-token prompt, 128 new tokens: batch 1 on a long context (a chat's history), where each step reads
    as much KV cache as SmolLM2's weights; it fills the harness's 2048-token context.
Prompts are token ids drawn from a fixed seed among ordinary (non-special) tokens, so every engine
gets exactly the same input without tokenizer differences.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    num_prompts: int
    prompt_len: int
    new_tokens: int

    def prompts(self, vocab_size: int = 49152, first_id: int = 17) -> list[list[int]]:
        rng = random.Random(f"{self.name}-{self.num_prompts}-{self.prompt_len}")
        return [[rng.randrange(first_id, vocab_size) for _ in range(self.prompt_len)] for _ in range(self.num_prompts)]


WORKLOADS = {
    "W": Workload("W", 32, 128, 128),
    "B1": Workload("B1", 1, 128, 128),
    "B8": Workload("B8", 8, 128, 128),
    "B1L": Workload("B1L", 1, 1920, 128),
}
