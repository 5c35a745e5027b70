"""LoRA adapters under tensor parallelism (real worker processes over gloo): A and B sharded as the base layers are
(column-parallel q/k/v and gate/up take B's rows, row-parallel o and down A's columns, their partial deltas summed
with the base's partial products). Two adapters and the base in one batch at TP=2 give the tokens of TP=1 and of
transformers + peft, logprobs within 1e-4; an adapter first named after the workers started, and one re-registered
under a freed id with another path, reach every rank (and the prefix cache does not serve the old adapter's KV)."""

from __future__ import annotations

import pytest
import torch

from rtp_llm import LLM, SamplingParams
from rtp_llm.lora import LoRARequest
from rtp_llm.models.default_model import default_model_path
from tests.engine.lora_helpers import make_adapter, reference
from tests.models.tiny_checkpoints import make_checkpoint

GREEDY = SamplingParams(max_tokens=8, temperature=0, logprobs=0, ignore_eos=True)


def outputs(outs):
    return [(o.outputs[0].token_ids, [x.logprob for x in o.outputs[0].logprobs]) for o in outs]


@pytest.mark.parametrize("variant", ["llama_9h_3kv_odd", "qwen3_kv1_tied"])
def test_adapters_under_tp_match_tp1_and_peft(tmp_path, variant):
    """llama_9h_3kv_odd: uneven heads (6/3 query heads per rank), an odd MLP split and o/down biases (added after
    the all-reduce that the deltas join); qwen3_kv1_tied: one KV head replicated on both ranks."""
    base = tmp_path / "base"
    hf = make_checkpoint(base, variant)
    vocab = hf.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (6, 19, 11, 9)]
    refs = {"a": make_adapter(base, tmp_path / "a", 8, seed=1),
            "b": make_adapter(base, tmp_path / "b", 4, ["q_proj", "v_proj", "down_proj", "up_proj"], seed=2)}
    a, b = LoRARequest("a", 1, str(tmp_path / "a")), LoRARequest("b", 2, str(tmp_path / "b"))
    loras = [a, b, None, a]
    got = {}
    for tp in (1, 2):
        with LLM(str(base), tokenizer=default_model_path(), tp_size=tp, enable_lora=True, max_loras=2,
                 block_size=4, num_blocks=256, max_model_len=256) as llm:
            first = outputs(llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras))
            # "a" unloaded, its id taken by b's weights under a new name: every rank must switch, and the prefix
            # cache, which holds a's KV of this prompt, must miss (a cache key per load, not per id)
            llm.core.unload_lora("a")
            again = outputs(llm.generate(prompts[:1], GREEDY, use_tqdm=False,
                                         lora_request=LoRARequest("b2", 1, str(tmp_path / "b"))))
            got[tp] = first, again
    for (t1, l1), (t2, l2) in zip(got[1][0] + got[1][1], got[2][0] + got[2][1]):
        assert t1 == t2
        torch.testing.assert_close(torch.tensor(l2), torch.tensor(l1), atol=1e-4, rtol=0)
    first, again = got[2]
    for prompt, lora, (tokens, _) in zip(prompts, loras, first):
        if lora is None:
            with refs["a"].disable_adapter():
                assert tokens == reference(refs["a"], prompt, 8)[0]
        else:
            assert tokens == reference(refs[lora.lora_name], prompt, 8)[0]
    assert again[0][0] == reference(refs["b"], prompts[0], 8)[0]
    assert len({tuple(t) for t, _ in first[:3]}) == 3  # each adapter changes the answer
