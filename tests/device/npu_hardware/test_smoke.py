"""The first run on a real Ascend NPU (Atlas A2/A3): each operator the engine calls against a plain float64 CPU
reference written here, the sampler's counter RNG against the CPU bit for bit, the custom operator package, NPUGraph
replay against eager, and a 20-token greedy decode of a tiny bf16 model against the CPU engine in bf16.

Skipped (with the reason) where no real NPU is visible. `python -m tests.device.npu_hardware.report` runs it and
prints a report to paste back."""

import os

import pytest
import torch

from tests.device.npu_hardware.hardware import REASON

pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "a real NPU is visible")

NPU = "npu:0"


@pytest.fixture(scope="module", autouse=True)
def device():
    import torch_npu  # noqa: F401  (registers torch.npu)

    torch.npu.set_device(0)
    yield


def test_fused_attention_mixed_batch_matches_the_cpu_reference():
    """A prefill, a decode and a chunk over a cached prefix in one npu_fused_infer_attention_score call (TND, paged
    BnBsH, block 128, sparse_mode 3), as rtp_llm/device/npu/attention.py calls it: within bf16 accumulation of the
    float64 attention of the same bf16 inputs."""
    import torch_npu

    from tests.device.npu.helpers import plain_attention

    g = torch.Generator().manual_seed(0)
    q_lens, kv_lens, heads, kv_heads, d, bs, nb = [5, 1, 3], [5, 200, 131], 4, 2, 128, 128, 8
    q = torch.randn(sum(q_lens), heads, d, generator=g).bfloat16()
    kc = torch.randn(nb, bs, kv_heads, d, generator=g).bfloat16()
    vc = torch.randn(nb, bs, kv_heads, d, generator=g).bfloat16()
    bt = torch.tensor([[1, 0], [2, 3], [4, 5]], dtype=torch.int32)
    cum = [sum(q_lens[: i + 1]) for i in range(len(q_lens))]
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.int8), 1)
    out = torch_npu.npu_fused_infer_attention_score(
        q.to(NPU), kc.to(NPU).view(nb, bs, -1), vc.to(NPU).view(nb, bs, -1), atten_mask=mask.to(NPU),
        actual_seq_lengths=cum, actual_seq_lengths_kv=kv_lens, block_table=bt.to(NPU), num_heads=heads,
        scale=d ** -0.5, input_layout="TND", num_key_value_heads=kv_heads, sparse_mode=3, block_size=bs)[0].cpu()
    ref = plain_attention(q, kc, vc, bt.tolist(), q_lens, kv_lens, d ** -0.5, kv_heads)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2 ** -7)


def test_cache_write_lands_in_its_slots():
    """npu_scatter_pa_kv_cache (cache_mode Norm) writes each token's K/V at its slot and nowhere else."""
    import torch_npu

    g = torch.Generator().manual_seed(1)
    nb, bs, kv_heads, d = 4, 128, 2, 128
    k = torch.randn(7, kv_heads, d, generator=g).bfloat16()
    v = torch.randn(7, kv_heads, d, generator=g).bfloat16()
    slots = torch.tensor([0, 1, 130, 257, 300, 511, 128], dtype=torch.int32)
    kc = torch.zeros(nb, bs, kv_heads, d, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    kc_n, vc_n = kc.to(NPU), vc.to(NPU)
    torch_npu.npu_scatter_pa_kv_cache(k.to(NPU), v.to(NPU), kc_n, vc_n, slots.to(NPU), cache_mode="Norm")
    want_k, want_v = kc.view(-1, kv_heads, d).clone(), vc.view(-1, kv_heads, d).clone()
    want_k[slots.long()], want_v[slots.long()] = k, v
    assert torch.equal(kc_n.cpu().view(-1, kv_heads, d), want_k)
    assert torch.equal(vc_n.cpu().view(-1, kv_heads, d), want_v)


def test_the_sampler_rng_draws_the_cpu_bits():
    """rtp_llm/device/random.py is int64 multiply / xor / shift: on the AI Core it must wrap as on the CPU, or
    seeded sampling is no longer device independent."""
    from rtp_llm.device.random import uniform

    seeds = torch.tensor([0, 1, 12345, 2 ** 62 + 7, -5])
    steps = torch.tensor([0, 3, 100, 1, 2 ** 40])
    cpu = uniform(seeds, steps, 50_000)
    npu = uniform(seeds.to(NPU), steps.to(NPU), 50_000).cpu()
    assert torch.equal(cpu, npu)


def test_top_k_top_p_matches_the_cpu_twin():
    """The NPU sampler's top-k / top-p (NpuOps.top_k_top_p: npu_top_k_top_p, or the custom operator when installed)
    against rtp_llm/device/torch_ops.py's apply_top_k_top_p on the same float32 logits (the sampler's dtype): the
    same kept set and values per row."""
    from rtp_llm.device.npu.ops import NpuOps
    from rtp_llm.device.torch_ops import apply_top_k_top_p

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 3000, generator=g) * 3
    k = torch.tensor([5, 3000, 2000, 1024, 1, 40])
    p = torch.tensor([0.9, 0.8, 0.7, 0.5, 1.0, 0.95])
    out = NpuOps().top_k_top_p(logits.to(NPU), k.to(NPU), p.to(NPU)).cpu()
    want = apply_top_k_top_p(logits, k, p)
    assert torch.equal(torch.isinf(out), torch.isinf(want))
    assert torch.equal(out[~torch.isinf(out)], want[~torch.isinf(want)])


@pytest.mark.skipif(not os.environ.get("ASCEND_CUSTOM_OPP_PATH"), reason="ASCEND_CUSTOM_OPP_PATH is not set")
def test_the_custom_operator_package_loads_and_runs():
    from rtp_llm.device.npu.ops import load_custom_top_k_top_p
    from rtp_llm.device.torch_ops import apply_top_k_top_p

    op = load_custom_top_k_top_p()
    assert op is not None, "the package on ASCEND_CUSTOM_OPP_PATH or rtp_llm/_npu_ops.so did not load (see the log)"
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 151936, generator=g)
    k = torch.tensor([50, 1, 151936, 7], dtype=torch.int32)
    p = torch.tensor([0.9, 1.0, 0.3, 0.99])
    out = op(logits.to(NPU), p.to(NPU), k.to(NPU)).cpu()
    want = apply_top_k_top_p(logits, k, p)
    assert torch.equal(torch.isinf(out), torch.isinf(want))


def test_npugraph_replay_equals_eager():
    """A decode-shaped sequence (linear, add + RMSNorm, SwiGLU) captured once and replayed on new inputs copied into
    its static buffers gives the eager bits."""
    import torch_npu

    g = torch.Generator().manual_seed(4)
    w1 = torch.randn(256, 512, generator=g).bfloat16().to(NPU)
    gamma = torch.randn(256, generator=g).bfloat16().to(NPU)
    x_static = torch.zeros(8, 256, dtype=torch.bfloat16, device=NPU)
    r_static = torch.zeros_like(x_static)

    def step(x, r):
        y, _, s = torch_npu.npu_add_rms_norm(x, r, gamma, 1e-6)
        return torch_npu.npu_swiglu(y @ w1, dim=-1), s

    step(x_static, r_static)  # warm up outside the capture
    torch.npu.synchronize()
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        out_static, s_static = step(x_static, r_static)
    for seed in (5, 6):
        gi = torch.Generator().manual_seed(seed)
        x, r = (torch.randn(8, 256, generator=gi).bfloat16().to(NPU) for _ in range(2))
        x_static.copy_(x)
        r_static.copy_(r)
        graph.replay()
        eager, s_eager = step(x, r)
        torch.npu.synchronize()
        assert torch.equal(out_static.cpu(), eager.cpu()) and torch.equal(s_static.cpu(), s_eager.cpu())


def test_a_tiny_bf16_model_decodes_20_tokens_like_the_cpu(tmp_path):
    """The whole engine on the NPU (paged cache, 128-token blocks) against transformers and the CPU engine in bf16:
    greedy tokens equal up to the first near tie of the bf16 rule (tests/models/bf16_rule.py), 20 per prompt."""
    from rtp_llm.models.default_model import default_model_path
    from rtp_llm.tokenizer import Tokenizer
    from tests.device.npu.helpers import assert_engines_agree, assert_transformers_agree, engine, greedy
    from tests.device.npu.helpers import margin_of, reference_logits
    from tests.engine.helpers import run_all
    from tests.models.tiny_checkpoints import make_checkpoint

    hf = make_checkpoint(tmp_path, "qwen3_hd128").to(torch.bfloat16)
    tokenizer = Tokenizer.load(default_model_path())
    prompts = [[5, 6, 7, 8], list(range(30, 190))]
    outs = {dev: run_all(engine(tmp_path, tokenizer, dev), [(0, f"r{i}", p, greedy(20)) for i, p in enumerate(prompts)])
            for dev in ("npu", "cpu")}
    compared = 0
    for i, prompt in enumerate(prompts):
        ours = outs["npu"][f"r{i}"].outputs[0]
        assert len(ours.token_ids) == 20
        assert_transformers_agree(hf, prompt, ours.token_ids)
        margin = margin_of(reference_logits(hf, prompt, ours.token_ids))
        compared += assert_engines_agree(ours, outs["cpu"][f"r{i}"].outputs[0], margin)
    assert compared >= 20  # not vacuous: at least half the tokens compared before any near tie
