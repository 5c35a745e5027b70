import pytest

from tests.server.server_process import ServerProcess

COMMON = ("--max_model_len", "1024", "--kv_cache_memory_gb", "0.25", "--max_num_seqs", "32")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny random Llama over the embedded tokenizer's whole vocabulary (its free answers are garbage): what the
    tests that script or constrain answers serve (tiny_server)."""
    from tests.models.tiny_checkpoints import make_checkpoint

    path = tmp_path_factory.mktemp("tiny_full_vocab")
    make_checkpoint(path, "llama_full_vocab")
    return str(path)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(*COMMON)
    yield srv
    code = srv.stop()
    assert code == 0, srv.output()[-3000:]
