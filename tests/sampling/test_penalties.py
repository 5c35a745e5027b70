"""The penalties on seen tokens only (rtp_llm/sampling/penalties.py): counts kept token by token equal counts made
from scratch, and the penalised logits equal the dense [rows, vocab] formulas (Hugging Face's repetition penalty,
OpenAI's presence / frequency), written out here, bit for bit."""

import random

import torch

from rtp_llm.sampling import Sampler, SamplingBatch, SamplingParams
from rtp_llm.sampling.penalties import TokenCounts


def _dense(logits, prompts, outputs, params):
    """The formulas over the whole vocabulary, one row at a time."""
    out = logits.clone()
    vocab = logits.shape[-1]
    for r, (prompt, output, p) in enumerate(zip(prompts, outputs, params)):
        x = out[r]
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[list(prompt) + list(output)] = True
        rep = torch.tensor(p.repetition_penalty, dtype=torch.float32)
        x = torch.where(seen, torch.where(x < 0, x * rep, x / rep), x)
        counts = torch.bincount(torch.tensor(output, dtype=torch.int64), minlength=vocab).float()
        f = torch.tensor(p.frequency_penalty, dtype=torch.float32)
        pr = torch.tensor(p.presence_penalty, dtype=torch.float32)
        out[r] = x - f * counts - pr * (counts > 0).float()
    return out


def test_counts_kept_token_by_token_equal_counts_made_from_scratch():
    rnd = random.Random(0)
    prompt = [rnd.randrange(50) for _ in range(30)]
    output = [rnd.randrange(50) for _ in range(200)]
    kept = TokenCounts(prompt)
    for i in range(0, len(output), 7):  # as the runner brings it up to the output after each step
        kept.follow(output[:i + 7])
    fresh = TokenCounts(prompt, output)
    assert sorted(kept.seen_ids().tolist()) == sorted(set(prompt + output)) == sorted(fresh.seen_ids().tolist())
    ids, counts = kept.output_counts()
    assert dict(zip(ids.tolist(), counts.tolist())) == {t: float(output.count(t)) for t in set(output)}
    drafts = [49, 49, 3]
    ahead = kept.plus(drafts)  # a speculating row's view: the drafts counted, the kept counts unchanged
    ids2, counts2 = ahead.output_counts()
    assert dict(zip(ids2.tolist(), counts2.tolist())) == {t: float((output + drafts).count(t))
                                                          for t in set(output + drafts)}
    assert dict(zip(*[a.tolist() for a in kept.output_counts()])) == dict(zip(ids.tolist(), counts.tolist()))


def test_penalised_logits_equal_the_dense_formulas_bit_for_bit():
    gen = torch.Generator().manual_seed(4)
    rnd = random.Random(4)
    vocab, rows = 300, 7
    logits = torch.randn(rows, vocab, generator=gen) * 5
    params = [SamplingParams(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25),
              SamplingParams(temperature=1.0),  # no penalty beside penalised rows
              SamplingParams(temperature=0.7, repetition_penalty=0.8),
              SamplingParams(temperature=1.0, presence_penalty=-1.0, frequency_penalty=-0.5),
              SamplingParams(temperature=1.0, frequency_penalty=2.0),
              SamplingParams(temperature=1.0, repetition_penalty=2.0),
              SamplingParams(temperature=1.0, repetition_penalty=1.1, frequency_penalty=0.1)]
    prompts = [[rnd.randrange(vocab) for _ in range(rnd.randrange(1, 60))] for _ in range(rows)]
    outputs = [[rnd.randrange(vocab) for _ in range(rnd.randrange(0, 90))] for _ in range(rows)]
    b = SamplingBatch.build(params, [0] * rows, [0] * rows, prompts, outputs, vocab)
    assert torch.equal(Sampler.apply_penalties(logits, b), _dense(logits, prompts, outputs, params))
    # the same rows with counts the caller keeps
    kept = [TokenCounts(p, o) if q.penalises else None for p, o, q in zip(prompts, outputs, params)]
    b2 = SamplingBatch.build(params, [0] * rows, [0] * rows, prompts, outputs, vocab, counts=kept)
    assert torch.equal(Sampler.apply_penalties(logits, b2), _dense(logits, prompts, outputs, params))
