"""The pooling runner under tensor parallelism (real worker processes over gloo): embeddings (mean pooling over a
vocab-parallel embedding and split heads), cross-encoder scores and classes at TP=2 against TP=1 and transformers;
the yes/no reranker recipe, which reads the vocab-parallel LM head on one rank, refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rtp_llm import LLM
from rtp_llm.models.default_model import default_model_path
from tests.models.pooling_checkpoints import make_cross_encoder, make_embedding_model, make_yes_no_reranker

TEXTS = ["hello world", "The weather in Paris is mild in spring, with showers now and then.", "a",
         "Embeddings turn text into vectors; similar texts get similar vectors. " * 3]


def engine(path, tp, **kw):
    return LLM(str(path), tokenizer=default_model_path(), max_model_len=512, kv_cache_memory_gb=0.05, tp_size=tp,
               max_prefill_chunk=16, **kw)


@pytest.mark.parametrize("task", ["embed", "classify"])
def test_pooling_under_tp_matches_tp1_and_transformers(tmp_path, task):
    """Mean-pooled embeddings and a 3-label classifier's probabilities, prompts chunked in 16-row pieces (every
    chunk a step both ranks run)."""
    if task == "embed":
        model = make_embedding_model(tmp_path, "mean")
        pool = lambda llm: llm.embed(TEXTS, use_tqdm=False)  # noqa: E731
        reference = lambda x: F.normalize(model(x).last_hidden_state[0].float().mean(0), dim=-1)  # noqa: E731
    else:
        model = make_cross_encoder(tmp_path, num_labels=3, labels=["a", "b", "c"])
        pool = lambda llm: llm.classify(TEXTS, use_tqdm=False)  # noqa: E731
        reference = lambda x: torch.softmax(model(x).logits[0], -1)  # noqa: E731
    got = {}
    for tp in (1, 2):
        with engine(tmp_path, tp) as llm:
            got[tp] = pool(llm)
            ids = [llm.tokenizer.encode(t) for t in TEXTS]
    for v1, v2, x in zip(got[1], got[2], ids):
        torch.testing.assert_close(torch.tensor(v2), torch.tensor(v1), rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(torch.tensor(v2), reference(torch.tensor([x])), rtol=1e-4, atol=1e-5)


def test_the_yes_no_recipe_is_refused_under_tp(tmp_path):
    make_yes_no_reranker(tmp_path)
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"]}
    with pytest.raises(ValueError, match="classifier_from_token.*tp_size 1"):
        engine(tmp_path, 2, runner="pooling", hf_overrides=overrides)
