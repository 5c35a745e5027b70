"""The CPU backend (C++ paged attention kernel; C++ prefill kernel, or SDPA without AVX-512) against the
torch_ref reference and against a plain per-head softmax attention in float64, on mixed batches, block
sizes, GQA ratios, head sizes and dtypes."""

import pytest
import torch

from rtp_llm.cache import KVBuffer, KVCacheManager
from rtp_llm.device.attention import TorchRefAttention
from rtp_llm.device.cpu.attention import CpuAttention
from rtp_llm.device.forward_batch import ForwardBatch


def _batch(block_size, q_lens, ctx_lens):
    num_blocks = sum((c + q + block_size - 1) // block_size for q, c in zip(q_lens, ctx_lens)) + 4
    m = KVCacheManager(num_blocks, block_size, enable_prefix_cache=False)
    tokens, starts, slots = [], [], []
    for i, (ql, cl) in enumerate(zip(q_lens, ctx_lens)):
        m.add_sequence(i, list(range(cl + ql)))
        if cl:
            m.allocate_slots(i, cl)  # already-cached context
        s, _ = m.allocate_slots(i, ql)
        tokens.append(list(range(cl, cl + ql)))
        starts.append(cl)
        slots.append(s)
    width = max((c + q + block_size - 1) // block_size for q, c in zip(q_lens, ctx_lens))
    table = m.block_tables(list(range(len(q_lens))), width)
    return ForwardBatch.build(tokens, starts, slots, table, block_size), num_blocks


@pytest.mark.parametrize("prefill_kernel", [True, False])
@pytest.mark.parametrize("block_size", [1, 16, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (9, 3)])
@pytest.mark.parametrize("shape", ["decode", "short_chunks", "mixed", "prefill", "fresh_uniform"])
def test_cpu_backend_matches_torch_ref(block_size, heads, kv_heads, shape, prefill_kernel):
    """Every path of prepare(): decodes only; decodes and chunks of <= PAGED_MAX_Q tokens (after a cached
    prefix or fresh), all through the paged kernel row by row; those mixed with longer prefills (the prefill
    kernel on their rows; without it the paged kernel takes every row); longer prefills only; fresh prompts of one
    length."""
    short = CpuAttention.PAGED_MAX_Q
    q_lens, ctx = {"decode": ([1, 1, 1], [5, 40, 130]),
                   "short_chunks": ([1, short, 1, 3, 2], [9, 0, 200, 17, 48]),
                   "mixed": ([1, 20, 1, 3, short + 1, short], [9, 0, 200, 17, 40, 33]),
                   "prefill": ([16, short + 1], [0, 31]), "fresh_uniform": ([12, 12, 12], [0, 0, 0])}[shape]
    batch, nb = _batch(block_size, q_lens, ctx)
    g = torch.Generator().manual_seed(block_size + heads)
    d = 64
    kv = KVBuffer(1, nb, block_size, kv_heads, d)
    kv.buffer.normal_(generator=g)
    kv_ref = KVBuffer(1, nb, block_size, kv_heads, d)
    kv_ref.buffer.copy_(kv.buffer)
    T = batch.num_tokens
    q, k, v = (torch.randn(T, n, d, generator=g) for n in (heads, kv_heads, kv_heads))
    args = (heads, kv_heads, d, d ** -0.5, block_size)
    cpu, ref = CpuAttention(*args), TorchRefAttention(*args)
    if prefill_kernel and not cpu.prefill_kernel:
        pytest.skip("the prefill kernel needs AVX-512")
    cpu.prefill_kernel = prefill_kernel
    meta = cpu.prepare(batch)
    assert meta.all_paged == (shape in ("decode", "short_chunks") or not prefill_kernel)
    out = cpu.forward(q, k, v, kv.layer(0), meta)
    want = ref.forward(q, k, v, kv_ref.layer(0), ref.prepare(batch))
    assert torch.allclose(out, want, atol=2e-5), (out - want).abs().max()
    assert torch.equal(kv.buffer, kv_ref.buffer)  # the same K/V were written


def test_prefill_rows_in_a_dtype_the_prefill_kernel_lacks_take_the_paged_kernel():
    """float16 rows planned for the prefill kernel (float32 / bfloat16 only) go through the paged kernel, row by
    row with their causal lengths: the bits of the step planned all-paged, mixed with short chunks or not."""
    for q_lens, ctx in (([20, 9], [0, 31]), ([1, 20, 3], [9, 0, 17])):
        batch, nb = _batch(16, q_lens, ctx)
        g = torch.Generator().manual_seed(len(q_lens))
        kv = KVBuffer(1, nb, 16, 2, 64, dtype=torch.float16)
        kv.buffer.copy_(torch.randn(kv.buffer.shape, generator=g))
        q, k, v = (torch.randn(batch.num_tokens, n, 64, generator=g).half() for n in (4, 2, 2))
        outs = []
        for planned in (True, False):
            cpu = CpuAttention(4, 2, 64, 0.125, 16)
            cpu.prefill_kernel = planned
            meta = cpu.prepare(batch)
            assert meta.all_paged != planned
            outs.append(cpu.forward(q, k, v, kv.layer(0), meta))
        assert torch.equal(outs[0], outs[1])


def test_decode_kernel_against_plain_softmax_and_bf16():
    batch, nb = _batch(16, [1, 1], [20, 3])
    g = torch.Generator().manual_seed(0)
    kv = KVBuffer(1, nb, 16, 2, 64, dtype=torch.bfloat16)
    kv.buffer.copy_(torch.randn(kv.buffer.shape, generator=g))
    q = torch.randn(2, 4, 64, generator=g).bfloat16()
    k = torch.randn(2, 2, 64, generator=g).bfloat16()
    cpu = CpuAttention(4, 2, 64, 0.125, 16)
    out = cpu.forward(q, k, k, kv.layer(0), cpu.prepare(batch)).float()
    table = batch.block_table.tolist()
    for b, L in enumerate(batch.kv_lens):
        slots = [table[b][j // 16] * 16 + j % 16 for j in range(L)]
        K = kv.layer(0)[0].reshape(-1, 2, 64)[slots].float()
        V = kv.layer(0)[1].reshape(-1, 2, 64)[slots].float()
        for h in range(4):
            w = torch.softmax(K[:, h // 2] @ q[b, h].float() * 0.125, 0)
            assert torch.allclose(out[b, h], w @ V[:, h // 2], atol=2e-2)


def test_kernel_rejects_bad_arguments():
    from rtp_llm._native import ops

    k = torch.zeros(4, 16, 2, 64)
    q = torch.zeros(1, 4, 64)
    with pytest.raises(RuntimeError, match="int32"):
        ops().paged_attention(q, k, k, torch.zeros(1, 2, dtype=torch.int64), torch.tensor([3]), 1.0)
    with pytest.raises(RuntimeError, match="outside"):
        ops().paged_attention(q, k, k, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([40]), 1.0)


def _random_decode_inputs(lens, block_size, heads, kv_heads, dim, dtype, g, spare_blocks):
    """A shuffled block table for `lens` (spare blocks unused), random K / V caches and one query row per sequence."""
    width = (int(lens.max()) + block_size - 1) // block_size
    nb = len(lens) * width + spare_blocks
    table = torch.randperm(nb, generator=g)[: len(lens) * width].to(torch.int32).reshape(len(lens), width)
    k = torch.randn(nb, block_size, kv_heads, dim, generator=g).to(dtype)
    v = torch.randn(nb, block_size, kv_heads, dim, generator=g).to(dtype)
    q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)
    return table, k, v, q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size,dim", [(16, 64), (12, 64), (8, 40), (4, 128), (8, 48), (16, 80)])
@pytest.mark.parametrize("heads,kv_heads", [(2, 1), (6, 3), (5, 1), (12, 2), (3, 3)])
def test_decode_kernel_paths_against_float64(dtype, block_size, dim, heads, kv_heads):
    """Every path of the kernel against a float64 softmax over the gathered rows: on AVX-512 CPUs the
    AVX-512 path (float32 / bf16, head_dim a multiple of 16: 64- and 128-column value strips and 16-column
    tails at 48 and 80; 1-3 query heads per pass, 4-6 split into passes), the AVX2 path (float16 here; every
    dtype in test_cpu_ops's RTP_LLM_CPU_NO_AVX512=1 process) with each query-group size it specialises (1-4
    heads per pass, and 5-6 split into passes), the scalar path (head_dim 40), power-of-two and other block
    sizes (a shift or a division per token), lengths that leave tails after the 8-key and 16-token tiles,
    batches below and above the thread count."""
    from rtp_llm._native import ops

    g = torch.Generator().manual_seed(block_size * 1000 + dim + heads)
    lens = torch.tensor([1, 7, 8, 9, 17, 33, 130][: (2 if heads == 5 else 7)])
    table, k, v, q = _random_decode_inputs(lens, block_size, heads, kv_heads, dim, dtype, g, spare_blocks=3)
    scale = dim ** -0.5
    out = ops().paged_attention(q, k, v, table, lens, scale)
    group = heads // kv_heads
    for b, n in enumerate(lens.tolist()):
        slots = [int(table[b, j // block_size]) * block_size + j % block_size for j in range(n)]
        K = k.reshape(-1, kv_heads, dim)[slots].double()
        V = v.reshape(-1, kv_heads, dim)[slots].double()
        for h in range(heads):
            w = torch.softmax(K[:, h // group] @ q[b, h].double() * scale, 0)
            tol = 1e-5 if dtype == torch.float32 else 2e-2  # 16-bit outputs: one rounding of the result
            torch.testing.assert_close(out[b, h].double(), w @ V[:, h // group], atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size,dim,heads,kv_heads", [(128, 64, 9, 3), (16, 64, 14, 2), (12, 80, 4, 4),
                                                           (16, 128, 6, 1)])
@pytest.mark.parametrize("threads,lens", [(2, [1003]), (3, [1003, 130]), (2, [1003, 5]), (2, [700, 300, 9])])
def test_decode_long_sequences_split_across_threads(dtype, block_size, dim, heads, kv_heads, threads, lens):
    """A long sequence with threads to spare, or beside shorter ones (longer than a thread's share of the keys):
    the kernel splits its keys, softmax rows and value columns across the threads instead of giving a thread the
    whole sequence or its KV heads; the rest run as tasks. Lengths on and off the 8-key groups and the 16-token
    value tiles, 3 KV heads on 2 threads (which do not divide), column ranges that cut a head: the same bits as one
    thread computing each sequence whole (batch invariance: a sequence decoded alone equals itself in a batch), and
    float64's values."""
    from rtp_llm._native import ops

    g = torch.Generator().manual_seed(block_size + dim + heads + threads + len(lens))
    lens = torch.tensor(lens)
    table, k, v, q = _random_decode_inputs(lens, block_size, heads, kv_heads, dim, dtype, g, spare_blocks=2)
    scale = dim ** -0.5
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one task per sequence, each computed whole
        whole = ops().paged_attention(q, k, v, table, lens, scale)
        torch.set_num_threads(threads)  # len(lens) < threads: the split
        split = ops().paged_attention(q, k, v, table, lens, scale)
        alone = ops().paged_attention(q[:1], k, v, table[:1], lens[:1], scale)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(split, whole)
    assert torch.equal(alone[0], whole[0])
    starts = torch.arange(len(lens) + 1)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(split.double(), _float64_attention(q, k, v, table, starts, lens, scale), atol=tol,
                               rtol=tol)


def _float64_attention(q, k, v, table, starts, kv_lens, scale):
    """Row j of sequence s (n_s rows) over keys [0, kv_len - n_s + j], in float64."""
    heads, kv_heads, dim, bs = q.shape[1], k.shape[2], q.shape[2], k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for s, L in enumerate(kv_lens.tolist()):
        slots = [int(table[s, j // bs]) * bs + j % bs for j in range(L)]
        K = k.reshape(-1, kv_heads, dim)[slots].double()
        V = v.reshape(-1, kv_heads, dim)[slots].double()
        rows = range(int(starts[s]), int(starts[s + 1]))
        ctx = L - len(rows)
        for j, r in enumerate(rows):
            for h in range(heads):
                g = h // (heads // kv_heads)
                w = torch.softmax(K[: ctx + j + 1, g] @ q[r, h].double() * scale, 0)
                out[r, h] = w @ V[: ctx + j + 1, g]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size,dim,heads,kv_heads", [(16, 64, 9, 3), (12, 48, 4, 1), (4, 128, 6, 2),
                                                           (16, 80, 2, 2), (128, 16, 12, 3)])
def test_prefill_kernel_against_float64(dtype, block_size, dim, heads, kv_heads):
    """The prefill kernel on sequences of 1-150 new rows after 0-90 cached keys (tails after its 6-vector
    query tiles, 16- and 64-key score blocks and 64-column value strips; row blocks of one long sequence),
    shuffled blocks, strided q rows (a column slice of qkv, as the model passes it), against float64; each
    sequence's rows the same whatever other sequences share the call, and the same bits as the decode kernel's."""
    from rtp_llm._native import ops

    if ops().cpu_isa() != "avx512":
        pytest.skip("the prefill kernel needs AVX-512")
    g = torch.Generator().manual_seed(block_size * 100 + dim)
    rows, ctx = [1, 7, 65, 150, 20], [0, 90, 3, 0, 47]
    lens = [r + c for r, c in zip(rows, ctx)]
    width = (max(lens) + block_size - 1) // block_size
    nb = len(rows) * width + 2
    table = torch.randperm(nb, generator=g)[: len(rows) * width].to(torch.int32).reshape(len(rows), width)
    k = torch.randn(nb, block_size, kv_heads, dim, generator=g).to(dtype)
    v = torch.randn(nb, block_size, kv_heads, dim, generator=g).to(dtype)
    qkv = torch.randn(sum(rows), (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    q = qkv[:, : heads * dim].view(-1, heads, dim)
    assert not q.is_contiguous()
    starts = torch.tensor([0] + rows).cumsum(0)
    kv_lens = torch.tensor(lens)
    scale = dim ** -0.5
    out = ops().prefill_attention(q, k, v, table, starts, kv_lens, scale)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), _float64_attention(q, k, v, table, starts, kv_lens, scale), atol=tol,
                               rtol=tol)
    # sequence 3 alone: the same bits
    alone = ops().prefill_attention(q[int(starts[3]):int(starts[4])], k, v, table[3:4].contiguous(),
                                    torch.tensor([0, rows[3]]), kv_lens[3:4], scale)
    assert torch.equal(alone, out[int(starts[3]):int(starts[4])])
    # Every row exactly as the decode kernel computes it alone (one query over its causal keys): a prompt's logits do
    # not depend on how it was chunked, whether its prefix was cached or whether it was recomputed after preemption.
    seq = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(rows))
    causal = torch.cat([torch.arange(c + 1, c + r + 1) for r, c in zip(rows, ctx)])
    paged = ops().paged_attention(q.contiguous(), k, v, table[seq].contiguous(), causal, scale)
    assert torch.equal(paged, out)


def test_prefill_kernel_rejects_bad_arguments():
    from rtp_llm._native import ops

    if ops().cpu_isa() != "avx512":
        pytest.skip("the prefill kernel needs AVX-512")
    k = torch.zeros(4, 16, 2, 64)
    q = torch.zeros(5, 4, 64)
    table = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="kv_len"):  # more rows than keys
        ops().prefill_attention(q, k, k, table, torch.tensor([0, 5]), torch.tensor([4]), 1.0)
    with pytest.raises(RuntimeError, match="capacity"):
        ops().prefill_attention(q, k, k, table, torch.tensor([0, 5]), torch.tensor([65]), 1.0)
    with pytest.raises(RuntimeError, match="q_starts must run"):
        ops().prefill_attention(q, k, k, table, torch.tensor([0, 4]), torch.tensor([5]), 1.0)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops().prefill_attention(torch.zeros(5, 4, 40), torch.zeros(4, 16, 2, 40), torch.zeros(4, 16, 2, 40), table,
                                torch.tensor([0, 5]), torch.tensor([5]), 1.0)
    with pytest.raises(RuntimeError, match="share a dtype"):
        ops().prefill_attention(q.bfloat16(), k, k, table, torch.tensor([0, 5]), torch.tensor([5]), 1.0)


@pytest.mark.parametrize("tokens", [1, 5, 700])
def test_write_kv_equals_index_put(tokens):
    """The C++ KV write puts every row where index_put puts it (k and v as the model slices them out of qkv:
    strided rows), touches nothing else, and refuses slots outside the cache and dtype mixes."""
    from rtp_llm._native import ops

    g = torch.Generator().manual_seed(tokens)
    kvh, d, blocks, bs = 3, 64, 64, 16
    qkv = torch.randn(tokens, (9 + 2 * kvh) * d, generator=g)
    k = qkv[:, 9 * d:(9 + kvh) * d].reshape(tokens, kvh, d)
    v = qkv[:, (9 + kvh) * d:].reshape(tokens, kvh, d)
    assert tokens == 1 or not k.is_contiguous()
    slots = torch.randperm(blocks * bs, generator=g)[:tokens]
    cache = torch.randn(2, blocks, bs, kvh, d, generator=g)
    want = cache.clone()
    want[0].view(-1, kvh, d)[slots] = k
    want[1].view(-1, kvh, d)[slots] = v
    ops().write_kv(k, v, cache, slots)
    assert torch.equal(cache, want)
    with pytest.raises(RuntimeError, match="outside"):
        ops().write_kv(k, v, cache, torch.full((tokens,), blocks * bs, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="share a dtype"):
        ops().write_kv(k.bfloat16(), v.bfloat16(), cache, slots)
