import pytest

from tests.server.server_process import ServerProcess

COMMON = ("--max_model_len", "1024", "--kv_cache_memory_gb", "0.25", "--max_num_seqs", "32")


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(*COMMON)
    yield srv
    code = srv.stop()
    assert code == 0, srv.output()[-3000:]
