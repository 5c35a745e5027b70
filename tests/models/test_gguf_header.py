"""rtp-llm's GGUF header reader against the gguf package's GGUFReader on the same files: every metadata value and
every tensor (name, type, shape, bytes) equal; a damaged file is a CheckpointError naming the problem."""

import gguf
import numpy as np
import pytest

from rtp_llm.errors import CheckpointError
from rtp_llm.models.default_model import default_model_path
from rtp_llm.models.gguf_reader import GGUFFile
from tests.models.tiny_gguf import write_tiny_gguf


def assert_same_as_gguf(path):
    ref, ours = gguf.GGUFReader(path), GGUFFile(path)
    ref_fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ref_fields == ours.fields
    assert [t.name for t in ref.tensors] == [t.name for t in ours.tensor_list]
    for a, b in zip(ref.tensors, ours.tensor_list):
        assert a.tensor_type == b.tensor_type and a.shape.tolist() == b.shape.tolist()
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert np.array_equal(a.data, b.data), a.name


def test_the_default_models_file_reads_as_gguf_reads_it():
    # Q4_1 and Q8_0 blocks, F32 norms, a 49,152-token vocabulary with merges and a chat template
    assert_same_as_gguf(default_model_path())


@pytest.mark.parametrize("fmt", ["Q5_0", "Q4_K", "Q6_K"])
def test_tiny_files_read_as_gguf_reads_them(tmp_path, fmt):
    assert_same_as_gguf(write_tiny_gguf(str(tmp_path / f"t_{fmt}.gguf"), fmt, with_vocab=False))


def test_a_damaged_file_is_a_checkpoint_error(tmp_path):
    good = write_tiny_gguf(str(tmp_path / "good.gguf"), "Q8_0", with_vocab=False)
    data = open(good, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="runs past the end of the file"):
        GGUFFile(str(cut))
    header_cut = tmp_path / "header_cut.gguf"
    header_cut.write_bytes(data[:200])
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        GGUFFile(str(header_cut))
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(CheckpointError, match="no GGUF magic"):
        GGUFFile(str(not_gguf))
    future = tmp_path / "v9.gguf"
    future.write_bytes(data[:4] + (9).to_bytes(4, "little") + data[8:])
    with pytest.raises(CheckpointError, match="GGUF version 9 is not supported"):
        GGUFFile(str(future))
