"""Real weights: SmolLM2-135M-Instruct from its pinned GGUF, against transformers loading the same
GGUF (same dequantized weights): greedy tokens, prefill logits, tokenizer ids, chat template."""

import os

import pytest
import torch

from rtp_llm.models.default_model import default_model_path
from rtp_llm.models.registry import load_model
from rtp_llm.sampling import SamplingParams
from rtp_llm.tokenizer import Tokenizer
from tests.models.static_generate import StaticRunner

TEXTS = [
    "Hello, world!",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "日本語のテキスト、中文，한국어 and emoji 🤖🚀",
    "def f(x):\n    return x ** 2  # squares\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "Numbers 1234567890 and 3.14159, URLs https://example.com/a?b=c",
    "",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colors."},
     {"role": "assistant", "content": "Red, green, blue."}, {"role": "user", "content": "Two more?"}],
]


@pytest.fixture(scope="module")
def gguf():
    return default_model_path()  # fails loudly (with the install command) if the package is missing


@pytest.fixture(scope="module")
def hf_tokenizer(gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))


@pytest.fixture(scope="module")
def ours(gguf):
    model, cfg = load_model(gguf)
    return model, cfg, Tokenizer.load(gguf)


@pytest.fixture(scope="module")
def hf_model(gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                dtype=torch.float32).eval()


def test_tokenizer_ids_and_decoding_match_transformers(ours, hf_tokenizer):
    tok = ours[2]
    assert tok.vocab_size == len(hf_tokenizer)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_tokenizer.encode(text), text
        assert tok.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids, skip_special_tokens=False)
        assert tok.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert tok.eos_token_id == hf_tokenizer.eos_token_id == 2


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_like_transformers(ours, hf_tokenizer, messages, add_generation_prompt):
    mine = ours[2].apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert mine == theirs


def test_greedy_tokens_and_prefill_logits_match_transformers(ours, hf_model):
    model, cfg, tok = ours
    prompts = [tok.encode(tok.apply_chat_template(c)) for c in CONVERSATIONS]
    prompts.append(tok.encode("The quick brown fox"))
    runner = StaticRunner(model, cfg, num_blocks=64, block_size=16)
    outs = runner.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True), keep_logits=True)
    hf_model.generation_config.eos_token_id = None
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                    max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True, pad_token_id=2)
        assert out.token_ids == ref.sequences[0, len(prompt):].tolist()
        for ours, theirs in zip(out.logits, ref.logits):  # prefill and every decode step
            assert (ours - theirs[0]).abs().max().item() < 1e-3
    assert "Paris" in tok.decode(outs[0].token_ids)
