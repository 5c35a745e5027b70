"""/v1/embeddings, /v1/score and /v1/rerank through the openai client and plain HTTP against real servers on tiny
random pooling checkpoints, checked against transformers: every input form and option, usage, the three rerank
paths, and the refusals (generation on a pooling server, pooling on a generating one)."""

import base64
import functools
import struct

import httpx
import openai
import pytest
import torch
import torch.nn.functional as F

from rtp_llm.models.default_model import default_model_path
from tests.models.pooling_checkpoints import make_cross_encoder, make_embedding_model
from tests.server.server_process import ServerProcess

DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "France's capital city is Paris.", "x"]


def _serve(path, *flags):
    return ServerProcess("--model", str(path), "--tokenizer_path", default_model_path(), "--max_model_len", "512",
                         "--kv_cache_memory_gb", "0.05", "--served_model_name", "pool", *flags)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    path = tmp_path_factory.mktemp("embed_mean")
    model = make_embedding_model(path, "mean")
    srv = _serve(path)
    yield srv, model
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    path = tmp_path_factory.mktemp("cross")
    model = make_cross_encoder(path)
    srv = _serve(path, "--task", "score")
    yield srv, model
    assert srv.stop() == 0


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from rtp_llm.tokenizer.tokenizer import Tokenizer

    return Tokenizer.load(default_model_path())


def _tokens(text):
    return _tokenizer().encode(text)


def _reference(model, ids):
    with torch.no_grad():
        return F.normalize(model(torch.tensor([ids])).last_hidden_state[0].float().mean(0), dim=-1)


def test_embeddings_for_every_input_form(embedder):
    srv, model = embedder
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    texts = ["hello world", "The weather in Paris is mild."]
    ids = [_tokens(t) for t in texts]
    for inp, want_ids in [(texts[0], ids[:1]), (texts, ids), (ids[1], ids[1:]), (ids, ids)]:
        r = client.embeddings.create(model="pool", input=inp)  # the SDK asks for base64 and decodes it
        assert [d.index for d in r.data] == list(range(len(want_ids)))
        for d, want in zip(r.data, want_ids):
            assert F.cosine_similarity(torch.tensor(d.embedding), _reference(model, want), dim=0) >= 0.9999
        assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(x) for x in want_ids)


def test_encoding_formats_and_dimensions(embedder):
    srv, model = embedder
    body = {"model": "pool", "input": "hello world"}
    floats = httpx.post(srv.url + "/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    packed = httpx.post(srv.url + "/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    vec = floats["data"][0]["embedding"]
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(vec, abs=0)  # the same float32 bits
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    short = httpx.post(srv.url + "/v1/embeddings", json={**body, "dimensions": 8}).json()["data"][0]["embedding"]
    full = _reference(model, _tokens("hello world"))
    torch.testing.assert_close(torch.tensor(short), F.normalize(full[:8], dim=-1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("body,param,words", [
    ({"input": []}, "input", "empty list"),
    ({"input": ""}, "input", "must not be empty"),
    ({"input": "hi", "dimensions": 65}, "dimensions", "exceeds the model's 64"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format", "float"),
    ({"input": [[1, 2], []]}, "input", "must not be empty"),
    ({"input": "hi", "model": "nope"}, "model", "does not exist"),
])
def test_bad_embedding_requests_are_400s_naming_the_field(embedder, body, param, words):
    srv, _ = embedder
    r = httpx.post(srv.url + "/v1/embeddings", json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


def test_a_pooling_server_refuses_generation_and_scores(embedder):
    srv, _ = embedder
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "runs --runner pooling" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/score", json={"text_1": "a", "text_2": "b"})
    assert r.status_code == 400 and "cross-encoder" in r.json()["error"]["message"]


def _score_ref(model, q, d):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=_tokenizer().backend)
    with torch.no_grad():
        return torch.sigmoid(model(torch.tensor([tok(q, d)["input_ids"]])).logits[0, 0]).item()


def test_score_one_to_many_and_pairs(reranker):
    srv, model = reranker
    q = "What is the capital of France?"
    r = httpx.post(srv.url + "/v1/score", json={"model": "pool", "text_1": q, "text_2": DOCS}).json()
    assert [d["index"] for d in r["data"]] == list(range(len(DOCS)))
    for d, doc in zip(r["data"], DOCS):
        assert d["object"] == "score" and abs(d["score"] - _score_ref(model, q, doc)) < 1e-5
    pairs = httpx.post(srv.url + "/score", json={"text_1": [q, "Fruit?"], "text_2": DOCS[:2]}).json()
    assert abs(pairs["data"][1]["score"] - _score_ref(model, "Fruit?", DOCS[1])) < 1e-5
    bad = httpx.post(srv.url + "/v1/score", json={"text_1": [q, q], "text_2": DOCS})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text_1"


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_orders_by_relevance_with_top_n_and_documents(reranker, path):
    srv, model = reranker
    q = "capital of France"
    docs = [DOCS[0], {"text": DOCS[1]}, DOCS[2], {"text": DOCS[3]}]  # Jina's strings, Cohere's objects
    r = httpx.post(srv.url + path, json={"model": "pool", "query": q, "documents": docs, "top_n": 3}).json()
    want = sorted(((_score_ref(model, q, d), i) for i, d in enumerate(DOCS)), key=lambda x: (-x[0], x[1]))[:3]
    assert [x["index"] for x in r["results"]] == [i for _, i in want]
    assert all(abs(x["relevance_score"] - s) < 1e-5 for x, (s, _) in zip(r["results"], want))
    assert all(x["document"]["text"] == DOCS[x["index"]] for x in r["results"])
    assert r["usage"]["total_tokens"] > 0
    bare = httpx.post(srv.url + path, json={"query": q, "documents": DOCS, "return_documents": False}).json()
    assert len(bare["results"]) == 4 and all("document" not in x for x in bare["results"])


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    path = tmp_path_factory.mktemp("classify")
    model = make_cross_encoder(path, num_labels=3, labels=["negative", "neutral", "positive"])
    srv = _serve(path, "--task", "classify")
    yield srv, model
    assert srv.stop() == 0


@pytest.mark.parametrize("path", ["/classify", "/v1/classify"])
def test_classify_gives_each_inputs_label_probabilities(classifier, path):
    """vLLM's /classify: texts, token ids and lists of them; probs = softmax of transformers' logits, label = the
    argmax's id2label name, num_classes; activation false = the raw logits; usage counts the prompt tokens."""
    srv, model = classifier
    ids = _tokens(DOCS[1])
    r = httpx.post(srv.url + path, json={"model": "pool", "input": [DOCS[0], DOCS[2]]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["id"].startswith("classify-") and body["model"] == "pool"
    names = ["negative", "neutral", "positive"]
    for d, text in zip(body["data"], [DOCS[0], DOCS[2]]):
        with torch.no_grad():
            logits = model(torch.tensor([_tokens(text)])).logits[0]
        torch.testing.assert_close(torch.tensor(d["probs"]), torch.softmax(logits, -1), rtol=1e-4, atol=1e-6)
        assert d["num_classes"] == 3 and d["label"] == names[int(logits.argmax())]
    assert body["usage"]["prompt_tokens"] == len(_tokens(DOCS[0])) + len(_tokens(DOCS[2]))
    one = httpx.post(srv.url + path, json={"input": ids, "activation": False}).json()["data"]
    assert len(one) == 1
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(one[0]["probs"]), model(torch.tensor([ids])).logits[0],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("body,param,words", [
    ({"input": []}, "input", "empty list"),
    ({"input": "hi", "top_k": 2}, "top_k", "does not implement this field"),
    ({"input": "hi", "model": "nope"}, "model", "does not exist"),
])
def test_bad_classify_requests_are_4xx_naming_the_field(classifier, body, param, words):
    srv, _ = classifier
    r = httpx.post(srv.url + "/classify", json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"], r.text


def test_classify_on_an_embedding_model_is_refused(embedder):
    srv, _ = embedder
    r = httpx.post(srv.url + "/classify", json={"input": "hi"})
    assert r.status_code == 400 and "cross-encoder" in r.json()["error"]["message"]
