"""Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral) against transformers on the same weights: the router
against transformers' own router modules (ties included), fp32 logits within 1e-4 and identical greedy tokens on
torch ops and on the CPU device's kernels, the three ways checkpoints spell expert tensors, bf16 within the bf16
rule, and batch invariance with tokens of different requests routed to the same experts."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from rtp_llm.device import get_device
from rtp_llm.device.torch_ops import route
from rtp_llm.layers.moe import SparseMoE
from rtp_llm.models.registry import load_model
from rtp_llm.sampling import SamplingParams
from tests.engine.helpers import Tiny, run_all
from tests.engine.invariance import TARGET, crowd, params, signature
from tests.models.bf16_rule import assert_transformers_agree
from tests.models.static_generate import StaticRunner
from tests.models.parity import PROMPTS, STEPS, hf_greedy
from tests.models.tiny_checkpoints import MOE_VARIANTS, make_checkpoint


def _hf_router(kind: str, experts: int, top_k: int, renormalize: bool):
    """transformers' router module with an identity weight: its logits are its input."""
    import transformers.models.mixtral.modeling_mixtral as mixtral
    import transformers.models.qwen3_moe.modeling_qwen3_moe as qwen3

    if kind == "mixtral":
        router = mixtral.MixtralTopKRouter(mixtral.MixtralConfig(hidden_size=experts, num_local_experts=experts,
                                                                 num_experts_per_tok=top_k))
    else:
        router = qwen3.Qwen3MoeTopKRouter(qwen3.Qwen3MoeConfig(hidden_size=experts, num_experts=experts,
                                                               num_experts_per_tok=top_k,
                                                               norm_topk_prob=renormalize))
    with torch.no_grad():
        router.weight.copy_(torch.eye(experts))
    return router


@pytest.mark.parametrize("kind,renormalize", [("qwen", False), ("qwen", True), ("mixtral", True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routing_matches_transformers_routers_ties_included(kind, renormalize, dtype):
    g = torch.Generator().manual_seed(3)
    experts = 7
    logits = torch.randn(64, experts, generator=g) * 3
    logits[:16] = torch.randint(0, 3, (16, experts), generator=g).float()  # rows full of exact ties
    logits[16:20] = 1.0  # every expert tied
    logits = logits.to(dtype)
    for top_k in (1, 2, 3, 7):
        hf = _hf_router(kind, experts, top_k, renormalize).to(dtype)
        with torch.no_grad():
            _, want_w, want_ids = hf(logits)
        got_w, got_ids = route(logits, top_k, renormalize, dtype if kind == "qwen" else None)
        assert torch.equal(got_ids, want_ids), top_k
        assert got_w.dtype == want_w.dtype and torch.equal(got_w, want_w), top_k


@pytest.fixture(scope="module", params=sorted(MOE_VARIANTS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_checkpoint(path, request.param)
    refs = [hf_greedy(hf, p) for p in PROMPTS]
    return path, hf, refs


def _check_parity(model, cfg, refs, block_size=16):
    runner = StaticRunner(model, cfg, num_blocks=3 * (80 // block_size + 2) + 1, block_size=block_size)
    outs = runner.generate(PROMPTS, SamplingParams(max_tokens=STEPS, temperature=0), keep_logits=True)
    for out, (ref_tokens, ref_logits) in zip(outs, refs):
        assert out.token_ids == ref_tokens
        for step, (ours, theirs) in enumerate(zip(out.logits, ref_logits)):
            diff = (ours - theirs).abs().max().item()
            assert diff < 1e-4, f"step {step}: max |logit diff| {diff}"
    assert runner.manager.stats().used_blocks == 0


@pytest.mark.parametrize("ops", ["torch", "cpu"])
def test_logits_and_greedy_tokens_match_transformers(checkpoint, ops):
    path, hf, refs = checkpoint
    model, cfg = load_model(str(path), dtype="float32", ops=get_device("cpu").ops() if ops == "cpu" else None)
    assert cfg.moe is not None and any(isinstance(layer.mlp, SparseMoE) for layer in model.layers)
    assert [isinstance(layer.mlp, SparseMoE) for layer in model.layers] == [
        cfg.routes(i) for i in range(cfg.num_layers)]
    _check_parity(model, cfg, refs)


def test_sparse_and_dense_layers_as_the_config_mixes_them(tmp_path):
    make_checkpoint(tmp_path / "a", "qwen3_moe_top8_e9_norm_mixed")  # mlp_only_layers=[1]
    make_checkpoint(tmp_path / "b", "qwen3_moe_top1_e7_step2")  # decoder_sparse_step=2
    a, _ = load_model(str(tmp_path / "a"), dtype="float32")
    b, _ = load_model(str(tmp_path / "b"), dtype="float32")
    assert [layer.moe for layer in a.layers] == [True, False, True]
    assert [layer.moe for layer in b.layers] == [False, True]


def _respell(src, dst, fused: bool):
    """The checkpoint in src with its expert tensors spelled another way: transformers 5's fused 3-D tensors
    (fused) or Mixtral's block_sparse_moe / w1 w3 w2 names."""
    os.makedirs(dst)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    out = {}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp."
        experts = cfg.get("num_experts") or cfg["num_local_experts"]
        if p + "gate.weight" not in tensors:
            continue
        names = [(p + f"experts.{e}.{x}_proj.weight") for e in range(experts) for x in ("gate", "up", "down")]
        parts = {n: tensors.pop(n) for n in names}
        if fused:
            out[p + "experts.gate_up_proj"] = torch.stack([
                torch.cat([parts[p + f"experts.{e}.gate_proj.weight"], parts[p + f"experts.{e}.up_proj.weight"]])
                for e in range(experts)])
            out[p + "experts.down_proj"] = torch.stack([parts[p + f"experts.{e}.down_proj.weight"]
                                                        for e in range(experts)])
        else:
            q = f"model.layers.{layer}.block_sparse_moe."
            out[q + "gate.weight"] = tensors.pop(p + "gate.weight")
            for e in range(experts):
                for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
                    out[q + f"experts.{e}.{w}.weight"] = parts[p + f"experts.{e}.{x}_proj.weight"]
    out.update(tensors)
    save_file(out, os.path.join(dst, "model.safetensors"))
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))


@pytest.mark.parametrize("fused", [True, False], ids=["fused_3d", "mixtral_names"])
def test_every_spelling_of_the_expert_tensors_loads_the_same_model(tmp_path, fused):
    src = tmp_path / "src"
    make_checkpoint(src, "qwen3_moe_top2_e5")
    _respell(str(src), str(tmp_path / "respelled"), fused)
    a, _ = load_model(str(src), dtype="float32")
    b, _ = load_model(str(tmp_path / "respelled"), dtype="float32")
    for x, y in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("variant", ["qwen3_moe_top2_e5", "qwen2_moe_shared", "mixtral_top2_e5"])
def test_bf16_tokens_follow_the_bf16_rule_against_transformers(tmp_path, variant):
    hf = make_checkpoint(tmp_path, variant)
    hf_bf16 = hf.to(torch.bfloat16)
    model, cfg = load_model(str(tmp_path), dtype="bfloat16", ops=get_device("cpu").ops())
    runner = StaticRunner(model, cfg, num_blocks=64, block_size=16)
    outs = runner.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0))
    for prompt, out in zip(PROMPTS, outs):
        assert_transformers_agree(hf_bf16, prompt, out.token_ids)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny_moe(request, tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp(f"moe_{request.param}"), variant="qwen3_moe_top2_e5", dtype=request.param,
                device_ops=True)


def test_a_token_is_the_same_whichever_tokens_share_its_experts(tiny_moe):
    """Five experts, two per token: every step's tokens share experts. A request alone, among others arriving
    over the steps, with its prefill chunked, with its prefix from the cache, and after preemption: identical tokens
    and logprobs, and in float32 transformers' greedy tokens."""
    alone = signature(run_all(tiny_moe.engine(), [(0, "t", TARGET, params("greedy"))])["t"])
    if tiny_moe.model.dtype == torch.float32:
        assert alone[0] == tiny_moe.greedy(TARGET, 14)
    for name, engine, arrivals in [
            ("crowd", tiny_moe.engine(), crowd(7, 12) + [(2, "t", TARGET, params("greedy"))]),
            ("chunked", tiny_moe.engine(max_prefill_chunk=5), crowd(8, 5) + [(1, "t", TARGET, params("greedy"))])]:
        assert signature(run_all(engine, arrivals)["t"]) == alone, name
    engine = tiny_moe.engine()
    run_all(engine, [(0, "warm", TARGET[:30], SamplingParams(max_tokens=1, temperature=0))])
    got = run_all(engine, [(0, "t", TARGET, params("greedy"))])["t"]
    assert got.num_cached_tokens == 28 and signature(got) == alone, "cached prefix"
    engine = tiny_moe.engine(num_blocks=30, max_model_len=64, max_num_seqs=8)
    got = run_all(engine, [(0, "t", TARGET, params("greedy"))] + crowd(6, 7, longest=30))["t"]
    assert engine.scheduler.num_preemptions > 0 and signature(got) == alone, "preempted"
