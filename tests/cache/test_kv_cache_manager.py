"""The C++ KVCacheManager through its Python binding: buffers, typed errors, prefix reuse, fork."""

import numpy as np
import pytest

from rtp_llm.cache import KVCacheManager, OutOfBlocksError, SequenceError


def test_slots_written_into_caller_buffer_match_block_table():
    m = KVCacheManager(num_blocks=16, block_size=4)
    assert m.add_sequence(1, list(range(10))) == 0
    slots = np.full(10, -1, dtype=np.int32)
    assert m.append_slots(1, slots) == []
    table = m.block_table(1)
    assert slots.tolist() == [table[i // 4] * 4 + i % 4 for i in range(10)]


def test_torch_tensor_numpy_views_are_written_in_place():
    torch = pytest.importorskip("torch")
    m = KVCacheManager(16, 4)
    m.add_sequence(5, np.arange(6, dtype=np.int32))
    slots = torch.full((6,), -1, dtype=torch.int32)
    m.append_slots(5, slots.numpy())
    assert (slots >= 4).all()  # never the padding block 0
    tables = torch.full((2, 3), -1, dtype=torch.int32)
    m.add_sequence(6, [1])
    m.append_slots(6, np.empty(1, np.int32))
    m.fill_block_tables(np.array([5, 6], dtype=np.int64), tables.numpy())
    assert tables[0, :2].tolist() == m.block_table(5)
    assert tables[1].tolist() == [m.block_table(6)[0], 0, 0]


def test_wrong_buffer_types_are_rejected_with_the_argument_name():
    m = KVCacheManager(8, 4)
    m.add_sequence(1, [1, 2, 3])
    with pytest.raises(TypeError, match="slots_out must be a buffer of int32"):
        m.append_slots(1, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        m.append_slots(1, np.zeros(6, dtype=np.int32)[::2])


def test_out_of_blocks_is_a_typed_exception_and_changes_nothing():
    m = KVCacheManager(num_blocks=3, block_size=2)
    m.add_sequence(1, list(range(6)))
    with pytest.raises(OutOfBlocksError):
        m.append_slots(1, np.empty(6, np.int32))
    assert m.num_slots(1) == 0
    assert m.stats().free_blocks == 2
    assert issubclass(OutOfBlocksError, RuntimeError)


def test_unknown_and_double_free_name_the_id():
    m = KVCacheManager(8, 2)
    m.add_sequence(41, [1, 2])
    m.free(41)
    with pytest.raises(SequenceError, match="41"):
        m.free(41)
    with pytest.raises(SequenceError, match="12345"):
        m.block_table(12345)


def test_prefix_hit_counts_and_hit_rate():
    m = KVCacheManager(32, 4)
    prompt = list(range(100, 112))
    m.add_sequence(1, prompt)
    m.allocate_slots(1, 12)
    assert m.add_sequence(2, prompt[:9] + [7, 7]) == 8
    assert m.block_table(2) == m.block_table(1)[:2]
    st = m.stats()
    assert (st.prefix_query_tokens, st.prefix_hit_tokens) == (23, 8)
    assert st.hit_rate == pytest.approx(8 / 23)


def test_fork_copy_on_write_reports_the_copy():
    m = KVCacheManager(16, 4)
    m.add_sequence(1, list(range(6)))
    m.allocate_slots(1, 6)
    m.fork(1, 2)
    slots = np.empty(1, np.int32)
    copies = m.append_decode(np.array([2], np.int64), np.array([9], np.int32), slots)
    parent, child = m.block_table(1), m.block_table(2)
    assert copies == [(parent[1], child[1])]
    assert child[0] == parent[0]
    assert slots[0] == child[1] * 4 + 2


def test_constructor_validation():
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(1, 4)
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(8, 0)
