"""The engine's model graph on the paged cache vs Hugging Face transformers on the same weights:
fp32 logits within 1e-4 at prefill and at every decode step, identical greedy tokens over 32 steps,
for mixed prompt lengths, block sizes 1, 16 and 128, and with a cached prefix."""

import pytest
import torch

from rtp_llm.models.registry import load_model
from rtp_llm.sampling import SamplingParams
from tests.models.parity import PROMPTS, STEPS, hf_greedy
from tests.models.static_generate import StaticRunner
from tests.models.tiny_checkpoints import VARIANTS, make_checkpoint


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_checkpoint(path, request.param)
    model, cfg = load_model(str(path), dtype="float32")
    refs = [hf_greedy(hf, p) for p in PROMPTS]
    return hf, model, cfg, refs


@pytest.mark.parametrize("block_size", [1, 16, 128])
def test_logits_and_greedy_tokens_match_transformers(checkpoint, block_size):
    hf, model, cfg, refs = checkpoint
    runner = StaticRunner(model, cfg, num_blocks=3 * (80 // block_size + 2) + 1, block_size=block_size)
    outs = runner.generate(PROMPTS, SamplingParams(max_tokens=STEPS, temperature=0), keep_logits=True)
    for out, (ref_tokens, ref_logits) in zip(outs, refs):
        assert out.token_ids == ref_tokens
        assert len(out.logits) == STEPS
        for step, (ours, theirs) in enumerate(zip(out.logits, ref_logits)):
            diff = (ours - theirs).abs().max().item()
            assert diff < 1e-4, f"step {step}: max |logit diff| {diff}"
    assert runner.manager.stats().used_blocks == 0


def test_cached_prefix_gives_the_same_logits(checkpoint):
    hf, model, cfg, _ = checkpoint
    runner = StaticRunner(model, cfg, num_blocks=64, block_size=4)
    shared = PROMPTS[2][:20]
    first = shared + [7, 8, 9]
    second = shared + [100, 101]
    runner.generate([first], SamplingParams(max_tokens=2, temperature=0))
    out = runner.generate([second], SamplingParams(max_tokens=STEPS, temperature=0), keep_logits=True)[0]
    assert out.cached_tokens == 20  # 5 whole blocks of the shared prefix were reused, not recomputed
    ref_tokens, ref_logits = hf_greedy(hf, second)
    assert out.token_ids == ref_tokens
    for ours, theirs in zip(out.logits, ref_logits):
        assert (ours - theirs).abs().max().item() < 1e-4


def test_one_forward_mixing_prefill_chunk_full_prefill_and_decode(checkpoint):
    """A single model call holding: the second chunk of a chunked prefill, a whole prefill, and a
    decode-shaped step (one new token over cached KV). Each row's logits match the full-sequence
    forward of transformers at that position."""
    hf, model, cfg, _ = checkpoint
    runner = StaticRunner(model, cfg, num_blocks=64, block_size=4, enable_prefix_cache=False)
    m = runner.manager
    a, b, c = PROMPTS[2][:10], PROMPTS[1], PROMPTS[0]
    for sid, p in ((1, a), (2, b), (3, c)):
        m.add_sequence(sid, p)
    # Step 1: first chunk of a, and all of c but its last token.
    s_a1, _ = m.allocate_slots(1, 4)
    s_c1, _ = m.allocate_slots(3, len(c) - 1)
    runner.forward([1, 3], [a[:4], c[:-1]], [0, 0], [s_a1, s_c1], need_logits=[False, False])
    # Step 2: rest of a (chunk), all of b (prefill), last token of c (decode-shaped).
    s_a2, _ = m.allocate_slots(1, 6)
    s_b, _ = m.allocate_slots(2, len(b))
    s_c2, _ = m.allocate_slots(3, 1)
    logits = runner.forward([1, 2, 3], [a[4:], b, c[-1:]], [4, 0, len(c) - 1], [s_a2, s_b, s_c2])
    with torch.no_grad():
        for row, p in enumerate((a, b, c)):
            ref = hf(torch.tensor([p])).logits[0, -1]
            assert (logits[row] - ref).abs().max().item() < 1e-4
