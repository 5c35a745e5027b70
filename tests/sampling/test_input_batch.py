"""The persistent input batch (rtp_llm/sampling/input_batch.py): across steps whose rows join, leave, reorder and
repeat (speculative rows), with slots reused and the columns grown, every step's batch equals SamplingBatch.build
on the same rows. That an engine frees the rows of finished requests: tests/engine/test_engine.py."""

import random

import torch

from rtp_llm.sampling import SamplingBatch, SamplingParams
from rtp_llm.sampling.input_batch import InputBatch
from rtp_llm.sampling.penalties import PenaltyRows, TokenCounts

VOCAB = 60


def _params(rnd: random.Random) -> SamplingParams:
    p = SamplingParams(max_tokens=8)
    kind = rnd.randrange(4)
    p.temperature = 0.0 if kind == 0 else rnd.choice([0.5, 1.0, 1.3])
    if rnd.random() < 0.4:
        p.top_k = rnd.choice([1, 5, VOCAB, VOCAB + 3, -1])
    if rnd.random() < 0.4:
        p.top_p = rnd.choice([0.3, 0.9, 1.0])
    if rnd.random() < 0.3:
        p.min_p = 0.1
    if rnd.random() < 0.3:
        p.repetition_penalty = rnd.choice([1.0, 1.3])
    if rnd.random() < 0.3:
        p.presence_penalty, p.frequency_penalty = rnd.choice([(0.5, 0.0), (0.0, 0.25), (0.2, 0.1)])
    if rnd.random() < 0.3:
        p.logprobs = rnd.choice([-1, 0, 3])
    if rnd.random() < 0.2:
        p.allowed_token_ids = rnd.sample(range(VOCAB), 5)
    if rnd.random() < 0.2:
        p.logit_bias = {rnd.randrange(VOCAB): rnd.uniform(-5, 5) for _ in range(rnd.randrange(1, 4))}
    if rnd.random() < 0.2:
        p.bad_words_token_ids = [[rnd.randrange(VOCAB)], [rnd.randrange(VOCAB), rnd.randrange(VOCAB)]]
    return p


def _same(a, b, name):
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        assert a is not None and b is not None and len(a) == len(b), name
        for x, y in zip(a, b):
            _same(x, y, name)
    elif isinstance(a, PenaltyRows) or isinstance(b, PenaltyRows):
        assert a is not None and b is not None, name
        for f in ("seen_rows", "seen_ids", "out_rows", "out_ids", "out_counts"):
            _same(getattr(a, f), getattr(b, f), f"{name}.{f}")
    elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert a is not None and b is not None, name
        assert a.dtype == b.dtype and torch.equal(a, b), name
    else:
        assert a == b, name


def test_every_step_equals_a_batch_built_from_scratch():
    rnd = random.Random(3)
    rows = InputBatch(VOCAB, capacity=2)  # grows several times
    seqs = {}  # key -> [params, seed, prompt, output]
    live, sampled, next_key = [], set(), 0
    for step in range(300):
        for _ in range(rnd.randrange(3)):  # joins
            seqs[next_key] = [_params(rnd), rnd.randrange(2 ** 40), [rnd.randrange(VOCAB) for _ in range(4)], []]
            live.append(next_key)
            next_key += 1
        if live and rnd.random() < 0.3:  # leaves: the scheduler reports them finished
            gone = rnd.sample(live, rnd.randrange(1, min(3, len(live)) + 1))
            live = [k for k in live if k not in gone]
            rows.remove(gone + [10 ** 9])  # a key never added is ignored
        if not live:
            continue
        keys = [k for k in live if rnd.random() < 0.8] or live[:1]
        rnd.shuffle(keys)
        if rnd.random() < 0.2:  # a speculating sequence's rows: the same key, one more output token each
            keys = keys + [keys[0]] * 2
        for k in keys:
            if k not in rows:
                rows.add(k, seqs[k][0], seqs[k][1])
        sampled.update(keys)
        outputs = [list(seqs[k][3]) for k in keys]
        for i in range(1, len(keys)):
            if keys[i] == keys[i - 1]:
                outputs[i] = outputs[i - 1] + [rnd.randrange(VOCAB)]
        counts = [TokenCounts(seqs[k][2], o) if seqs[k][0].penalises else None for k, o in zip(keys, outputs)]
        got = rows.batch(keys, [len(o) for o in outputs], outputs, counts)
        want = SamplingBatch.build([seqs[k][0] for k in keys], [seqs[k][1] for k in keys],
                                   [len(o) for o in outputs], [seqs[k][2] for k in keys], outputs, VOCAB,
                                   counts=counts)
        for field in SamplingBatch.__dataclass_fields__:
            _same(getattr(got, field), getattr(want, field), f"step {step}: {field}")
        for k in set(keys):
            seqs[k][3].append(rnd.randrange(VOCAB))
    assert len(rows) == len(sampled & set(live)) and len(rows.params) >= 16  # the finished ones were freed

