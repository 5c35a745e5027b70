"""The KV buffer is one allocation; every per-layer K/V view is a zero-copy view of it."""

import torch

from rtp_llm.cache import KVBuffer


def _buf():
    return KVBuffer(num_layers=3, num_blocks=5, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32)


def test_layer_views_share_the_single_allocation():
    kv = _buf()
    base = kv.buffer.untyped_storage().data_ptr()
    per_layer = 2 * 5 * 4 * 2 * 8 * 4  # bytes
    for i in range(3):
        view = kv.layer(i)
        assert view.shape == (2, 5, 4, 2, 8)
        assert view.untyped_storage().data_ptr() == base
        assert view.data_ptr() == base + i * per_layer
        k, v = view[0], view[1]
        assert k.is_contiguous() and v.is_contiguous()
        assert v.data_ptr() - k.data_ptr() == per_layer // 2
        # The BnBsH view fused attention reads is a view too, not a copy.
        assert k.view(5, 4, 16).data_ptr() == k.data_ptr()


def test_writes_through_a_view_land_in_the_buffer():
    kv = _buf()
    kv.layer(2)[1, 3, 2, 1] = 7.0  # V of layer 2, block 3, offset 2, head 1
    assert kv.buffer[2, 1, 3, 2, 1].eq(7.0).all()
    assert kv.buffer.sum().item() == 7.0 * 8


def test_copy_blocks_copies_k_and_v_of_every_layer():
    kv = _buf()
    kv.buffer.normal_()
    before = kv.buffer.clone()
    kv.copy_blocks([(1, 4), (2, 3)])
    assert torch.equal(kv.buffer[:, :, 4], before[:, :, 1])
    assert torch.equal(kv.buffer[:, :, 3], before[:, :, 2])
    assert torch.equal(kv.buffer[:, :, :3], before[:, :, :3])


def test_bytes_per_block():
    assert KVBuffer.bytes_per_block(3, 4, 2, 8, torch.bfloat16) == 3 * 2 * 4 * 2 * 8 * 2
    assert _buf().nbytes == 5 * KVBuffer.bytes_per_block(3, 4, 2, 8, torch.float32)
