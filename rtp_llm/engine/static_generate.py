"""Static-batch generation on the paged cache: one prefill of the whole batch, then batched decode
steps until every sequence stops. No scheduler: the batch must fit the pool.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from rtp_llm.engine.model_runner import ModelRunner
from rtp_llm.sampling import SamplingBatch, SamplingParams


@dataclass
class StaticOutput:
    token_ids: list[int]
    cached_tokens: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)  # per generated token, if asked
    finish_reason: str = "length"


def generate_static(runner: ModelRunner, prompts: Sequence[Sequence[int]], params: SamplingParams,
                    eos_token_ids: Sequence[int] = (), keep_logits: bool = False,
                    free: bool = True) -> list[StaticOutput]:
    m = runner.manager
    ids = [runner.new_seq_id() for _ in prompts]
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
    logits = runner.forward(ids, tokens, starts, slots, copies=copies)

    live = list(range(len(prompts)))
    for step in range(params.max_tokens):
        sb = SamplingBatch.build([params] * len(live), [seeds[i] for i in live], [step] * len(live),
                                 [prompts[i] for i in live], [outs[i].token_ids for i in live],
                                 logits.shape[-1], logits.device)
        new = runner.sampler(logits, sb).token_ids.cpu().tolist()
        still = []
        for row, i in enumerate(live):
            outs[i].token_ids.append(new[row])
            if keep_logits:
                outs[i].logits.append(logits[row].clone())
            stopped = new[row] in stops and len(outs[i].token_ids) > params.min_tokens
            if stopped:
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
        logits = runner.forward(seq.tolist(), [[int(t)] for t in last],
                                [len(prompts[i]) + len(outs[i].token_ids) - 1 for i in live],
                                [slot[j:j + 1] for j in range(len(live))], copies=copies)
    if free:
        for sid in ids:
            m.free(sid)
    return outs

