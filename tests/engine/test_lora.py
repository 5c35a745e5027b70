"""LoRA adapters made with peft on tiny random checkpoints (Llama, Qwen2, Qwen3; ranks 1, 8, 64; rslora; some
target modules only), served by the engine (LLM(..., enable_lora=True), the CPU device's kernels) and checked
against transformers + peft unmerged: greedy tokens identical, each token's logprob within 1e-4 in fp32; several
adapters and the base in one batch, each row the same bits as its run alone; the prefix cache never serves one
adapter's KV to another; slots evicted and reloaded; every bad adapter refused by name."""

import json
import os

import pytest
import torch

from rtp_llm import LLM, SamplingParams
from rtp_llm.errors import RequestRejected
from rtp_llm.lora import LoRARequest
from rtp_llm.models.default_model import default_model_path
from tests.engine.lora_helpers import ALL, make_adapter, reference
from tests.models.tiny_checkpoints import make_checkpoint

PROMPTS = [[5, 17, 33, 2, 90, 14, 7], [100, 3, 3, 41, 8, 250, 61, 19, 4, 77, 12], [9, 9]]


def engine(base, **kw):
    return LLM(str(base), tokenizer=default_model_path(), enable_lora=True, block_size=4, num_blocks=256,
               max_model_len=256, **kw)


GREEDY = SamplingParams(max_tokens=8, temperature=0, logprobs=0)


@pytest.mark.parametrize("variant,r,targets,rslora", [
    ("llama_gqa4_tied_attnbias", 8, ALL, False),
    ("qwen2_gqa4_bias_untied", 1, ["q_proj", "v_proj"], False),
    ("qwen3_gqa2_headdim32_untied", 64, ALL, True),
    ("qwen3_mha_tied", 8, ["gate_proj", "down_proj", "o_proj"], False),
])
def test_adapters_match_peft(tmp_path, variant, r, targets, rslora):
    make_checkpoint(tmp_path / "base", variant)
    ref = make_adapter(tmp_path / "base", tmp_path / "a", r, targets, rslora)
    llm = engine(tmp_path / "base", max_lora_rank=64)
    lora = LoRARequest("a", 1, str(tmp_path / "a"))
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=lora)
    for prompt, out in zip(PROMPTS, outs):
        tokens, lps = reference(ref, prompt, 8)
        assert out.outputs[0].token_ids == tokens
        got = [lp.logprob for lp in out.outputs[0].logprobs]
        assert max(abs(a - b) for a, b in zip(got, lps)) < 1e-4
    with ref.disable_adapter():  # the base model: rows without an adapter are the base's
        base_tokens, _ = reference(ref, PROMPTS[0], 8)
    assert llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == base_tokens
    assert base_tokens != outs[0].outputs[0].token_ids  # the adapter changes the answer


def test_mixed_batches_change_no_row(tmp_path):
    """Two adapters and the base in one batch (the first two share a prompt): every row the same bits (tokens and
    logprobs) as its request alone; the prefix cache keeps each adapter's KV to itself."""
    base = tmp_path / "base"
    make_checkpoint(base, "qwen3_gqa2_headdim32_untied")
    make_adapter(base, tmp_path / "a", 8, seed=1)
    make_adapter(base, tmp_path / "b", 4, ["q_proj", "up_proj"], seed=2)
    la, lb = LoRARequest("a", 1, str(tmp_path / "a")), LoRARequest("b", 2, str(tmp_path / "b"))
    llm = engine(base, max_loras=2)
    prompts = [PROMPTS[1], PROMPTS[1], PROMPTS[1], PROMPTS[0]]
    loras = [la, lb, None, la]
    alone = []
    for p, lo in zip(prompts, loras):
        alone.append(engine(base, max_loras=2).generate([p], GREEDY, use_tqdm=False, lora_request=lo)[0])
    together = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    again = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)  # prefixes now cached, per adapter
    for a, t, g in zip(alone, together, again):
        assert a.outputs[0].token_ids == t.outputs[0].token_ids == g.outputs[0].token_ids
        assert [x.logprob for x in a.outputs[0].logprobs] == [x.logprob for x in t.outputs[0].logprobs] \
            == [x.logprob for x in g.outputs[0].logprobs]
    assert len({tuple(t.outputs[0].token_ids) for t in together[:3]}) == 3  # one prompt, three answers


def test_more_adapters_than_slots_wait_and_swap(tmp_path, monkeypatch):
    """max_loras=1 with two adapters in flight: a step never mixes them (the second waits for the slot), and every
    answer is its own adapter's. With max_cpu_loras=1 the host still keeps both while requests run with them (each
    is read once, never again on the loop at a swap), and trims back to one when they are done."""
    from rtp_llm.lora.adapter import LoRAAdapter

    base = tmp_path / "base"
    make_checkpoint(base, "llama_gqa4_tied_attnbias")
    ra = make_adapter(base, tmp_path / "a", 8, seed=3)
    rb = make_adapter(base, tmp_path / "b", 8, seed=4)
    la, lb = LoRARequest("a", 1, str(tmp_path / "a")), LoRARequest("b", 2, str(tmp_path / "b"))
    llm = engine(base, max_loras=1, max_cpu_loras=1)
    reads, load = [], LoRAAdapter.load
    monkeypatch.setattr(LoRAAdapter, "load", lambda request, *a: reads.append(request.lora_name) or load(request, *a))
    outs = llm.generate([PROMPTS[0]] * 4, GREEDY, use_tqdm=False, lora_request=[la, lb, la, lb])
    want = {1: reference(ra, PROMPTS[0], 8)[0], 2: reference(rb, PROMPTS[0], 8)[0]}
    assert [o.outputs[0].token_ids for o in outs] == [want[1], want[2], want[1], want[2]]
    assert len(llm.core.lora.slots) == 1  # set_step raises if a step ever held both
    assert sorted(reads) == ["a", "b"] and len(llm.core.lora.host) == 1


def test_bad_adapters_are_refused_by_name_and_the_base_keeps_serving(tmp_path):
    base = tmp_path / "base"
    make_checkpoint(base, "qwen3_gqa2_headdim32_untied")
    make_adapter(base, tmp_path / "big", 32)
    other = tmp_path / "other_base"
    make_checkpoint(other, "qwen2_gqa4_bias_untied")
    make_adapter(other, tmp_path / "alien", 4)
    make_adapter(base, tmp_path / "saves", 4)
    cfg_path = tmp_path / "saves" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "modules_to_save": ["lm_head"]}))
    llm = engine(base, max_lora_rank=16)
    cases = [("big", "rank 32 exceeds --max_lora_rank 16"), ("alien", "another base model"),
             ("saves", "modules_to_save"), ("missing", "no adapter_config.json")]
    for i, (name, words) in enumerate(cases, start=1):
        with pytest.raises(RequestRejected, match=words):
            llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False,
                         lora_request=LoRARequest(name, i, str(tmp_path / name)))
    assert llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids  # the base still serves
    assert not llm.core.requests and llm.core.scheduler.manager.stats().used_blocks == 0
    with pytest.raises(RequestRejected, match="without --enable_lora"):
        LLM(str(base), tokenizer=default_model_path(), max_model_len=256).generate(
            [PROMPTS[0]], GREEDY, use_tqdm=False, lora_request=LoRARequest("a", 1, os.fspath(tmp_path / "big")))


def test_an_unloaded_adapter_finishes_its_running_requests_first(tmp_path):
    base = tmp_path / "base"
    make_checkpoint(base, "qwen3_mha_tied")
    ref = make_adapter(base, tmp_path / "a", 8, seed=5)
    llm = engine(base)
    lora = LoRARequest("a", 1, str(tmp_path / "a"))
    core = llm.core
    core.add_request(llm.processor.process("r", PROMPTS[0], GREEDY, lora=lora))
    tokens = [t for delta in core.step() for t in delta.samples[0].token_ids]  # the prefill, with the adapter
    core.unload_lora("a")
    assert "a" in core.lora.known and "a" in core.lora.retiring  # still serving its running request
    while core.has_unfinished():
        for delta in core.step():
            tokens += delta.samples[0].token_ids
    assert tokens == reference(ref, PROMPTS[0], 8)[0]  # the adapter's answer to the end
    assert "a" not in core.lora.known and not core.lora.slots  # then forgotten


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_layers_add_the_same_deltas_as_the_python_layers(tmp_path, dtype):
    """Steps with adapter rows run in the one C++ call of every decoder layer (device/cpu/fused_layers.py), which
    adds each linear layer's deltas as LinearLoRA.add does: two adapters (one on every module, one on q and up only)
    and the base in one batch give the same bits, tokens and logprobs, as the layer-by-layer Python path, with a
prefill's rows in one piece or in several."""
    base = tmp_path / "base"
    make_checkpoint(base, "qwen3_gqa2_headdim32_untied")
    make_adapter(base, tmp_path / "a", 8, seed=6)
    make_adapter(base, tmp_path / "b", 4, ["q_proj", "up_proj"], seed=7)
    loras = [LoRARequest("a", 1, str(tmp_path / "a")), LoRARequest("b", 2, str(tmp_path / "b")), None]
    prompts = [PROMPTS[1], PROMPTS[1][::-1] + PROMPTS[0], PROMPTS[1]]  # all over PAGED_MAX_Q: one prefill call
    got = {}
    for fused, pieces in ((True, None), (True, 5), (False, None)):  # 5: a prefill's rows cut into pieces
        # loaded at start: every request is admitted at once (a load on first use would stagger them)
        llm = engine(base, max_loras=2, dtype=dtype, lora_modules={"a": str(tmp_path / "a"), "b": str(tmp_path / "b")})
        model = llm.core.runner.model
        original = model.fused_layers
        assert original is not None and original.usable
        original.enabled = fused
        if pieces:
            assert original.rows_independent  # pieces need row-independent kernels (panels here)
            original.piece_rows = pieces
        adapter_steps = []

        class Watched:  # records whether each step with adapter rows ran in the C++ call
            def runs(self, meta):
                ran = original.runs(meta)
                if model.lora_ctx.active:
                    adapter_steps.append(ran)
                return ran

            def __call__(self, *args):
                return original(*args)

        model.fused_layers = Watched()
        outs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
        got[fused, pieces] = [(o.outputs[0].token_ids, [x.logprob for x in o.outputs[0].logprobs]) for o in outs]
        # the prefill and the decodes in the C++ call (once rows finish at different steps, every step still is)
        assert adapter_steps and all(adapter_steps) if fused else not any(adapter_steps)
    assert got[True, None] == got[True, 5] == got[False, None]
    assert len({tuple(t) for t, _ in got[False, None]}) == 3  # each adapter changes the answer


@pytest.fixture
def held_reads(monkeypatch):
    """A gate every adapter read waits at (on the loader thread) until the test sets it."""
    import threading

    from rtp_llm.lora.adapter import LoRAAdapter

    gate = threading.Event()
    load = LoRAAdapter.load

    def held_load(*args):
        gate.wait(30)
        return load(*args)

    monkeypatch.setattr(LoRAAdapter, "load", held_load)
    return gate


def test_adapters_load_off_the_step_loop(tmp_path, held_reads):
    """While an adapter is read (held here on the loader thread by a gate), a base request keeps stepping to its end;
    the adapter's request then runs with it. An adapter whose load fails in the engine (the caller did not check it)
    refuses its request after the fact, RequestRejected as add_request would have raised, with nothing of it run."""
    from rtp_llm.engine.protocol import EngineRequest

    base = tmp_path / "base"
    make_checkpoint(base, "qwen3_mha_tied")
    ref = make_adapter(base, tmp_path / "a", 8, seed=8)
    llm = engine(base)
    core = llm.core
    core.add_request(EngineRequest("lora", PROMPTS[0], GREEDY, lora=LoRARequest("a", 1, str(tmp_path / "a"))))
    core.add_request(EngineRequest("gone", PROMPTS[2], GREEDY, lora=LoRARequest("a", 1, str(tmp_path / "a"))))
    core.add_request(EngineRequest("base", PROMPTS[1], GREEDY))
    done, steps = {}, 0
    while "base" not in done:
        done.update({d.request_id: d for d in core.step() if d.finished})
        steps += 1
        assert steps < 100
    assert "lora" not in done and core.admissions.waiting  # the base request finished while the adapter loaded
    assert len(core.lora.loading) == 1  # one read for both requests
    core.abort("gone")  # aborted while it waits: it ends at once, the read goes on for the other
    held_reads.set()
    tokens = []
    while core.has_unfinished():
        for d in core.step():
            tokens += d.samples[0].token_ids if d.request_id == "lora" else []
            if d.request_id == "gone":
                assert d.finished and not d.samples[0].token_ids
    assert tokens == reference(ref, PROMPTS[0], 8)[0]
    # a path that is no adapter, named offline: refused after add_request, as RequestRejected
    with pytest.raises(RequestRejected, match="no adapter_config.json"):
        llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False, lora_request=LoRARequest("bad", 2, str(tmp_path)))
    assert not core.requests and not core.rejected and core.scheduler.manager.stats().used_blocks == 0
    assert "bad" not in core.lora.known  # forgotten: the name can be loaded again


def test_other_ranks_hear_of_an_adapter_while_rank_0_reads_it(tmp_path, held_reads):
    """Tensor parallelism's bookkeeping on one process: rank 0 names an adapter to the other ranks as soon as its
    read starts (untold), a rank that learns of it reads it on its own loader thread (learn returns at once), and the
    first step that uses it waits for that read."""
    base = tmp_path / "base"
    make_checkpoint(base, "qwen3_mha_tied")
    make_adapter(base, tmp_path / "a", 4, seed=9)
    path = str(tmp_path / "a")
    rank0, other = engine(base).core.lora, engine(base).core.lora
    rank0.admit(LoRARequest("a", 1, path))
    assert rank0.untold([]) == [(1, "a", path)] and rank0.untold([1]) == []  # told once, while it loads
    other.learn([(1, "a", path)])  # returns while the read is held
    assert (1, path) in other.loading and 1 not in other.host
    held_reads.set()
    other.set_step({1: [0, 1]})
    assert 1 in other.host and not other.loading and [s for s, _ in other.ctx.groups] == [other.slots[1]]
    other.clear_step()
