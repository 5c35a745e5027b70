"""The tensor-parallel sharding plan: every head, row and vocabulary entry owned as Megatron's scheme
requires, GQA kept uniform on every rank, and clear refusals for splits that cannot work."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.errors import ShardingError
from rtp_llm.models.sharding import TPShard, split_range
from rtp_llm.models.lazy_tensor import read_tensor


def _cfg(heads, kv, inter=96, vocab=256, head_dim=8, layers=1, tie=False):
    return ModelConfig(model_type="llama", architecture="LlamaForCausalLM", vocab_size=vocab,
                       hidden_size=heads * head_dim, intermediate_size=inter, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv, head_dim=head_dim, tie_word_embeddings=tie)


def test_split_range_partitions_evenly():
    for n, parts in itertools.product(range(1, 20), range(1, 6)):
        ranges = [split_range(n, parts, i) for i in range(parts)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [b - a for a, b in ranges]
        assert max(sizes) - min(sizes) <= 1


HEAD_LAYOUTS = [(h, kv) for h in range(1, 17) for kv in range(1, h + 1) if h % kv == 0]


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_heads_plan_keeps_every_rank_on_plain_gqa(tp):
    checked = 0
    for heads, kv in HEAD_LAYOUTS:
        cfg = _cfg(heads, kv)
        try:
            shards = [TPShard.plan(cfg, tp, r) for r in range(tp)]
        except ShardingError:
            # Refused only where no plan exists: more ranks than heads, or kv < tp without tp % kv == 0.
            assert tp > heads or (kv < tp and (tp % kv or heads // kv < tp // kv))
            continue
        checked += 1
        group = heads // kv
        owners = [0] * heads
        for s in shards:
            assert s.num_heads >= 1 and s.num_kv_heads >= 1
            assert s.num_heads % s.num_kv_heads == 0  # uniform local groups: the ordinary GQA kernels apply
            local_group = s.num_heads // s.num_kv_heads
            for h in range(s.head_start, s.head_stop):
                owners[h] += 1
                # The KV head the rank pairs with local query head h is h's KV head in the full model.
                assert s.kv_start + (h - s.head_start) // local_group == h // group
        assert owners == [1] * heads
        kv_owned = set().union(*(range(s.kv_start, s.kv_stop) for s in shards))
        assert kv_owned == set(range(kv))
        if kv < tp:  # replicated: each KV head on tp / kv ranks
            assert all(s.num_kv_heads == 1 for s in shards)
    assert checked


def test_smollm2_shape_splits_unevenly_over_two_ranks():
    cfg = _cfg(9, 3, inter=1536, vocab=49152)
    a, b = TPShard.plan(cfg, 2, 0), TPShard.plan(cfg, 2, 1)
    assert (a.num_heads, a.num_kv_heads, b.num_heads, b.num_kv_heads) == (6, 2, 3, 1)
    assert (a.intermediate, b.intermediate) == (768, 768)
    assert (a.vocab, b.vocab) == (24576, 24576)


def test_refusals_name_the_problem():
    with pytest.raises(ShardingError, match="multiple of 3"):
        TPShard.plan(_cfg(6, 3), 4, 0)
    with pytest.raises(ShardingError, match="attention heads"):
        TPShard.plan(_cfg(2, 1), 4, 0)
    with pytest.raises(ShardingError, match="vocab_size"):
        TPShard.plan(_cfg(8, 8, vocab=5), 8, 7)
    with pytest.raises(ShardingError, match="rank"):
        TPShard.plan(_cfg(4, 4), 2, 2)


@pytest.mark.parametrize("heads,kv,tp,tie",
                         [(4, 2, 2, False), (9, 3, 2, True), (4, 1, 2, False), (6, 3, 3, True), (8, 2, 4, False)])
def test_weight_slices_reassemble_the_full_model(heads, kv, tp, tie):
    """Concatenating the ranks' slices (each replicated KV head once) gives back every full tensor."""
    cfg = dataclasses.replace(_cfg(heads, kv, inter=97, vocab=255, layers=2, tie=tie), qkv_bias=True, mlp_bias=True)
    from rtp_llm.models.decoder import DecoderLM

    full = {n: torch.randn(s) for n, s in DecoderLM(cfg).expected_weights().items()}
    shards = [TPShard.plan(cfg, tp, r) for r in range(tp)]
    plans = [s.weight_slices(cfg) for s in shards]
    for name, tensor in full.items():
        if name not in plans[0]:  # replicated (norms, q/k norms, row-parallel biases)
            assert all(name not in p for p in plans), name
            continue
        pieces, seen = [], set()
        for p in plans:
            piece = p[name]
            if piece in seen:  # a replicated KV head
                continue
            seen.add(piece)
            pieces.append(read_tensor(tensor, piece))
        assert torch.equal(torch.cat(pieces, dim=plans[0][name][0]), tensor), name
