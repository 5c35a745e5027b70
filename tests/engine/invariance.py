"""What the batch-invariance tests share: a target request, a crowd of others arriving over the first steps, and a
request's signature (tokens and logprobs) to compare bit for bit."""

import random

from rtp_llm.sampling import SamplingParams

TARGET = [(i * 11 + 5) % 250 + 3 for i in range(37)]
MODES = {"greedy": dict(temperature=0), "seeded": dict(temperature=0.9, top_p=0.95, seed=1234)}


def params(mode, **kw):
    return SamplingParams(max_tokens=14, ignore_eos=True, logprobs=4, **MODES[mode], **kw)


def signature(out):
    o = out.outputs[0]
    return o.token_ids, [(lp.token_id, lp.logprob, tuple(lp.top)) for lp in o.logprobs]


def crowd(seed, n, longest=60):
    """n other requests of mixed lengths and sampling, arriving over the first steps."""
    rng = random.Random(seed)
    others = []
    for i in range(n):
        prompt = [rng.randrange(3, 250) for _ in range(rng.randrange(1, longest))]
        sp = SamplingParams(max_tokens=rng.randrange(1, 30), ignore_eos=True, temperature=rng.choice([0, 0.7, 1.2]),
                            seed=rng.randrange(1000), logprobs=rng.choice([None, 2]))
        others.append((rng.randrange(0, 6), f"o{seed}.{i}", prompt, sp))
    return others
