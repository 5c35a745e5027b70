"""A fixed batch on the paged cache, for tests that compare every step's logits with transformers: one prefill of
the whole batch, then batched decode steps until every sequence stops. No scheduler: a block manager of its own,
and the batch must fit the pool. The model call is the engine's (ModelRunner.forward)."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from rtp_llm.cache import KVCacheManager
from rtp_llm.device import get_device
from rtp_llm.distributed.step_message import StepMessage
from rtp_llm.engine.model_runner import ModelRunner
from rtp_llm.sampling import SamplingBatch, SamplingParams


@dataclass
class StaticOutput:
    token_ids: list[int]
    cached_tokens: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)  # per generated token, if asked
    finish_reason: str = "length"


class StaticRunner:
    def __init__(self, model, cfg, num_blocks: int, block_size: int, enable_prefix_cache: bool = True,
                 attention: str = "torch_ref"):
        self.manager = KVCacheManager(num_blocks, block_size, enable_prefix_cache)
        self.runner = ModelRunner(model, cfg, num_blocks, block_size, get_device("cpu"), attention)
        self.block_size = block_size
        self._ids = itertools.count(1)

    def forward(self, seq_ids, tokens, starts, slots, need_logits=None, copies=()):
        """One model call; sequence i's new tokens sit at starts[i].. with slots[i] already allocated."""
        bs = self.block_size
        width = max((s + len(t) + bs - 1) // bs for s, t in zip(starts, tokens))
        table = self.manager.block_tables(list(seq_ids), width)
        need = [True] * len(tokens) if need_logits is None else list(need_logits)
        return self.runner.forward(StepMessage([np.asarray(t) for t in tokens], list(starts), list(slots), need, table,
                                               list(copies)))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, eos_token_ids=(),
                 keep_logits: bool = False, free: bool = True) -> list[StaticOutput]:
        m = self.manager
        ids = [next(self._ids) for _ in prompts]
        seeds = [params.seed if params.seed is not None else random.getrandbits(63) for _ in prompts]
        outs = [StaticOutput([]) for _ in prompts]
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        tokens, starts, slots, copies = [], [], [], []
        for sid, prompt, out in zip(ids, prompts, outs):
            cached = m.add_sequence(sid, prompt)
            out.cached_tokens = cached
            s, c = m.allocate_slots(sid, len(prompt) - cached)
            copies.extend(c)
            tokens.append(list(prompt[cached:]))
            starts.append(cached)
            slots.append(s)
        logits = self.forward(ids, tokens, starts, slots, copies=copies)
        live = list(range(len(prompts)))
        for step in range(params.max_tokens):
            sb = SamplingBatch.build([params] * len(live), [seeds[i] for i in live], [step] * len(live),
                                     [prompts[i] for i in live], [outs[i].token_ids for i in live],
                                     logits.shape[-1], logits.device)
            new = self.runner.sampler(logits, sb).token_ids.cpu().tolist()
            still = []
            for row, i in enumerate(live):
                outs[i].token_ids.append(new[row])
                if keep_logits:
                    outs[i].logits.append(logits[row].clone())
                if new[row] in stops and len(outs[i].token_ids) > params.min_tokens:
                    outs[i].finish_reason = "stop"
                elif len(outs[i].token_ids) < params.max_tokens:
                    still.append(i)
            live = still
            if not live:
                break
            seq = np.array([ids[i] for i in live], dtype=np.int64)
            last = np.array([outs[i].token_ids[-1] for i in live], dtype=np.int32)
            slot = np.empty(len(live), dtype=np.int32)
            copies = m.append_decode(seq, last, slot)
            logits = self.forward(seq.tolist(), [[int(t)] for t in last],
                                  [len(prompts[i]) + len(outs[i].token_ids) - 1 for i in live],
                                  [slot[j:j + 1] for j in range(len(live))], copies=copies)
        if free:
            for sid in ids:
                m.free(sid)
        return outs


def assert_blocks_match_reference(model, dense, cfg, prompts, reference, steps: int) -> None:
    """A GGUF model kept as stored (model) and the same file dequantized at load (dense), greedy over `prompts`:
    the same tokens as reference(prompt, steps) -> (tokens, logits), logits within 1e-3 of its, and (AVX-512, where
    the blocks run the fp32 panels' sums) bit for bit the dequantized model's logits."""
    import torch

    from rtp_llm.sampling import SamplingParams

    params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
    ours = StaticRunner(model, cfg, num_blocks=32, block_size=16).generate(prompts, params, keep_logits=True)
    plain = StaticRunner(dense, cfg, num_blocks=32, block_size=16).generate(prompts, params, keep_logits=True)
    for prompt, out, out_dense in zip(prompts, ours, plain):
        tokens, logits = reference(prompt, steps)
        assert out.token_ids == tokens == out_dense.token_ids
        for mine, theirs in zip(out.logits, logits):
            assert (mine - theirs).abs().max().item() < 1e-3
        if model.ops.kernels.cpu_isa() == "avx512":
            assert all(torch.equal(a, b) for a, b in zip(out.logits, out_dense.logits))
