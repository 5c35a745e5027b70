"""The pooling runner (LLM(..., runner="pooling")) against transformers on tiny random checkpoints: embeddings of
each pooling kind (last token, mean, CLS, as the checkpoint's sentence-transformers files say), Matryoshka
dimensions, cross-encoder scores and classifications, the Qwen3-Reranker yes/no recipe; the result the same bits
however the prompt is chunked or batched; no KV block kept; requests of the wrong kind refused by name."""

import pytest
import torch
import torch.nn.functional as F

from rtp_llm import LLM
from rtp_llm.errors import RequestRejected
from rtp_llm.models.default_model import default_model_path
from rtp_llm.pooling import PoolingParams
from tests.models.pooling_checkpoints import make_cross_encoder, make_embedding_model, make_yes_no_reranker

TEXTS = ["hello world", "The weather in Paris is mild in spring, with showers now and then.", "a",
         "Embeddings turn text into vectors; similar texts get similar vectors. " * 3]


def engine(path, **kw):
    kw = {"tokenizer": default_model_path(), "max_model_len": 512, "kv_cache_memory_gb": 0.05, **kw}
    return LLM(str(path), **kw)


def reference_embedding(model, ids, kind, normalize):
    with torch.no_grad():
        h = model(torch.tensor([ids])).last_hidden_state[0].float()
    v = {"last": h[-1], "mean": h.mean(0), "cls": h[0]}[kind]
    return F.normalize(v, dim=-1) if normalize else v


@pytest.fixture(scope="module", params=["last", "mean", "cls"])
def embedder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"embed_{request.param}")
    model = make_embedding_model(path, request.param)
    llm = engine(path)  # runner auto: a checkpoint without an LM head pools
    yield request.param, model, llm
    llm.close()


def test_embeddings_match_transformers_for_each_pooling_kind(embedder):
    kind, model, llm = embedder
    vecs = llm.embed(TEXTS, use_tqdm=False)
    for text, v in zip(TEXTS, vecs):
        ref = reference_embedding(model, llm.tokenizer.encode(text), kind, normalize=kind != "cls")
        got = torch.tensor(v)
        assert got.shape == ref.shape
        assert F.cosine_similarity(got, ref, dim=0) >= 0.9999
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    assert llm.core.scheduler.manager.stats().used_blocks == 0  # nothing kept after the requests


def test_dimensions_truncate_then_renormalise(embedder):
    kind, model, llm = embedder
    ids = llm.tokenizer.encode(TEXTS[1])
    full = reference_embedding(model, ids, kind, normalize=False)
    v = torch.tensor(llm.embed([ids], PoolingParams("embed", dimensions=16), use_tqdm=False)[0])
    want = full[:16]
    if kind != "cls":  # the model normalises: the truncated vector is renormalised
        want = F.normalize(want, dim=-1)
    torch.testing.assert_close(v, want, rtol=1e-4, atol=1e-5)
    raw = torch.tensor(llm.embed([ids], PoolingParams("embed", normalize=False), use_tqdm=False)[0])
    torch.testing.assert_close(raw, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["last", "mean"])
def test_chunking_and_batching_change_no_bit(tmp_path, kind):
    make_embedding_model(tmp_path, kind)
    texts = TEXTS * 3
    whole = engine(tmp_path)
    alone = [whole.embed([t], use_tqdm=False)[0] for t in texts]
    batched = whole.embed(texts, use_tqdm=False)
    chunked = engine(tmp_path, max_prefill_chunk=5, max_num_batched_tokens=16).embed(texts, use_tqdm=False)
    assert alone == batched == chunked


def test_cross_encoder_scores_and_classes_match_transformers(tmp_path):
    from transformers import PreTrainedTokenizerFast

    one = make_cross_encoder(tmp_path / "one", num_labels=1)
    llm = engine(tmp_path / "one")
    query, docs = "What is the capital of France?", ["Paris is the capital of France.", "Bananas are yellow.", "x"]
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=llm.tokenizer.backend)
    scores = llm.score(query, docs, use_tqdm=False)
    for doc, s in zip(docs, scores):
        ids = llm.tokenizer.encode_pair(query, doc)
        assert ids == hf_tok(query, doc)["input_ids"]  # the pair as transformers' tokenizer(a, b) makes it
        with torch.no_grad():
            logit = one(torch.tensor([ids])).logits[0, 0]
        assert abs(s - torch.sigmoid(logit).item()) < 1e-5
    raw = llm.score([query] * 3, docs, PoolingParams("score", activation=False), use_tqdm=False)
    assert all(abs(torch.sigmoid(torch.tensor(r)).item() - s) < 1e-6 for r, s in zip(raw, scores))
    llm.close()

    three = make_cross_encoder(tmp_path / "three", num_labels=3, labels=["neg", "neutral", "pos"])
    llm = engine(tmp_path / "three")
    assert llm.core.model_config.labels == ["neg", "neutral", "pos"]  # id2label, by index
    outs = llm.classify([docs[0], llm.tokenizer.encode_pair(query, docs[1])], use_tqdm=False)  # text and ids
    for ids, out in zip([llm.tokenizer.encode(docs[0]), llm.tokenizer.encode_pair(query, docs[1])], outs):
        with torch.no_grad():
            want = torch.softmax(three(torch.tensor([ids])).logits[0], -1)
        torch.testing.assert_close(torch.tensor(out), want, rtol=1e-4, atol=1e-6)
    llm.close()


def test_yes_no_reranker_recipe_matches_the_causal_lms_logits(tmp_path):
    model = make_yes_no_reranker(tmp_path)
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"]}
    llm = engine(tmp_path, hf_overrides=overrides)
    tok = llm.tokenizer
    no, yes = (tok.encode(t, add_special_tokens=False)[0] for t in ("no", "yes"))
    pairs = [("Is the sky blue?", "The sky is blue on a clear day."), ("Is the sky blue?", "Cats purr.")]
    for (q, d), s in zip(pairs, llm.score([p[0] for p in pairs], [p[1] for p in pairs], use_tqdm=False)):
        with torch.no_grad():
            logits = model(torch.tensor([tok.encode_pair(q, d)])).logits[0, -1]
        want = torch.softmax(logits[[no, yes]], -1)[1].item()
        assert abs(s - want) < 1e-5
    llm.close()


def test_bf16_embeddings_stay_close_to_float32(tmp_path):
    model = make_embedding_model(tmp_path, "mean")
    llm = engine(tmp_path, dtype="bfloat16")
    for text, v in zip(TEXTS, llm.embed(TEXTS, use_tqdm=False)):
        ref = reference_embedding(model, llm.tokenizer.encode(text), "mean", normalize=True)
        assert F.cosine_similarity(torch.tensor(v), ref, dim=0) >= 0.999
    llm.close()


def test_requests_of_the_wrong_kind_are_refused_by_name(tmp_path):
    make_embedding_model(tmp_path / "e", "last")
    llm = engine(tmp_path / "e")
    with pytest.raises(RequestRejected, match="answers embed, not generate"):
        llm.generate("hi", use_tqdm=False)
    with pytest.raises(RequestRejected, match="not score .*cross-encoder"):
        llm.score("a", "b", use_tqdm=False)
    with pytest.raises(RequestRejected, match="dimensions: 65 exceeds the model's 64"):
        llm.embed("hi", PoolingParams("embed", dimensions=65), use_tqdm=False)
    with pytest.raises(RequestRejected, match="exceeds max_model_len=512"):
        llm.embed([[5] * 513], use_tqdm=False)
    with pytest.raises(ValueError, match="dimensions"):
        PoolingParams("score", dimensions=4)
    llm.close()
    gen = LLM(None, max_model_len=256, kv_cache_memory_gb=0.05)  # the embedded causal model: generate
    with pytest.raises(RequestRejected, match="start it with --runner pooling"):
        gen.embed("hi", use_tqdm=False)
    gen.close()
