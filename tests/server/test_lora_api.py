"""LoRA adapters through the HTTP API (vLLM's flags and routes) against a real server: a request's `model` picks
an adapter (its tokens are transformers + peft's), /v1/models lists adapters with their parent, adapters load and
unload at run time (--allow_runtime_lora_updating), and a bad adapter is a 400 naming the problem while the base
keeps serving."""

import httpx
import openai
import pytest
import torch

from rtp_llm.models.default_model import default_model_path
from tests.server.server_process import ServerProcess

PROMPT = [5, 17, 33, 2, 90, 14, 7]


def _adapter(base_dir, out, r, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32), LoraConfig(
        r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(20.0)
    model.save_pretrained(str(out))
    return model.eval()


def _greedy(model, n=6):
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(PROMPT):]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.models.tiny_checkpoints import make_checkpoint

    root = tmp_path_factory.mktemp("lora")
    make_checkpoint(root / "base", "llama_full_vocab")
    a, b = _adapter(root / "base", root / "a", 8, 1), _adapter(root / "base", root / "b", 4, 2)
    _adapter(root / "base", root / "big", 64, 3)
    srv = ServerProcess("--model", str(root / "base"), "--tokenizer_path", default_model_path(), "--max_model_len",
                        "256", "--kv_cache_memory_gb", "0.05", "--served_model_name", "base", "--enable_lora", "1",
                        "--lora_modules", f"a={root / 'a'}", "--max_loras", "2",
                        "--allow_runtime_lora_updating", "1")
    with a.disable_adapter():
        base_tokens = _greedy(a)
    yield srv, root, {"a": _greedy(a), "b": _greedy(b), "base": base_tokens}
    assert srv.stop() == 0


def complete(srv, model):
    return httpx.post(srv.url + "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 6,
                                                          "temperature": 0, "return_token_ids": True}, timeout=60)


def test_a_request_picks_its_adapter_by_model_name(setup):
    srv, _, want = setup
    for name in ("a", "base"):
        r = complete(srv, name)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == want[name]
    assert want["a"] != want["base"]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    chats = [client.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                            temperature=0, extra_body={"return_token_ids": True})
             for m in ("a", "base")]
    assert chats[0].choices[0].token_ids != chats[1].choices[0].token_ids  # the adapter applies to chat too
    models = {m["id"]: m for m in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert models["a"]["parent"] == "base" and models["base"]["parent"] is None


def test_adapters_load_and_unload_at_run_time(setup):
    srv, root, want = setup
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(root / "b")})
    assert r.status_code == 200 and "added" in r.text
    assert complete(srv, "b").json()["choices"][0]["token_ids"] == want["b"]
    assert complete(srv, "a").json()["choices"][0]["token_ids"] == want["a"]
    assert "b" in {m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]}
    wrong = httpx.post(srv.url + "/v1/unload_lora_adapter", json={"lora_name": "b", "lora_int_id": 99})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "lora_int_id"
    r = httpx.post(srv.url + "/v1/unload_lora_adapter", json={"lora_name": "b"})
    assert r.status_code == 200 and "removed" in r.text
    gone = complete(srv, "b")
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"
    assert httpx.post(srv.url + "/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 404


@pytest.mark.parametrize("body,param,words", [
    ({"lora_name": "big", "lora_path": "BIG"}, "lora_path", "rank 64 exceeds --max_lora_rank 16"),
    ({"lora_name": "nothing", "lora_path": "/no/such/adapter"}, "lora_path", "no adapter_config.json"),
    ({"lora_name": "a", "lora_path": "A"}, "lora_name", "is taken"),
    ({"lora_name": "base", "lora_path": "A"}, "lora_name", "is taken"),
])
def test_bad_adapters_are_400s_and_the_base_keeps_serving(setup, body, param, words):
    srv, root, want = setup
    body = {**body, "lora_path": {"BIG": str(root / "big"), "A": str(root / "a")}.get(body["lora_path"],
                                                                                     body["lora_path"])}
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]
    assert complete(srv, "base").json()["choices"][0]["token_ids"] == want["base"]


def test_an_adapter_the_engine_cannot_read_is_a_400_and_the_base_keeps_serving(setup):
    """Checked when loaded, then removed from disk before its first request: the engine's own read (on its loader
    thread) fails, and the request is refused after the fact as a 400 naming the problem, not a 5xx."""
    import shutil

    srv, root, want = setup
    shutil.copytree(root / "b", root / "fleeting")
    body = {"lora_name": "fleeting", "lora_path": str(root / "fleeting")}
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json=body)
    assert r.status_code == 200, r.text
    shutil.rmtree(root / "fleeting")
    gone = complete(srv, "fleeting")
    assert gone.status_code == 400, gone.text
    assert "no adapter_config.json" in gone.json()["error"]["message"]
    assert complete(srv, "base").json()["choices"][0]["token_ids"] == want["base"]


def test_a_gguf_adapter_through_the_openai_client(setup):
    """llama.cpp's GGUF adapter (written by its own converter from adapter b) loaded at run time and named by a
    request of the openai client: b's tokens, as its PEFT directory gives them."""
    from tests.engine.lora_helpers import convert

    srv, root, want = setup
    path = convert(root / "b", root / "base", root / "b.gguf")
    r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "b-gguf", "lora_path": path})
    assert r.status_code == 200, r.text
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    out = client.completions.create(model="b-gguf", prompt=PROMPT, max_tokens=6, temperature=0,
                                    extra_body={"return_token_ids": True})
    assert out.choices[0].token_ids == want["b"]
    assert "b-gguf" in {m.id for m in client.models.list().data}
