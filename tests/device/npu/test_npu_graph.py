"""Graph-mode decode on the (emulated) NPU: the emulator's NPUGraph records a captured step and replays it on the
same tensors; the fused attention's host lengths are frozen at capture unless NPUGraph.update replaces them (torch_npu
2.13's auto_dispatch_capture), and capture refuses host synchronisation as ACL's capture mode does. The engine's
decode steps replayed from graphs (padded to the captured batch sizes) give the eager steps' tokens and logprobs
bit for bit, while prefill stays eager."""

import pytest
import torch

from tests.npu_emulator.install import install

torch_npu = install()
torch.npu.set_device(0)

from rtp_llm.sampling import SamplingParams  # noqa: E402
from tests.device.npu.helpers import engine, tok  # noqa: E402,F401  (tok: a fixture)
from tests.engine.helpers import run_all  # noqa: E402
from tests.models.tiny_checkpoints import make_checkpoint  # noqa: E402
from torch_npu._graph import GraphCaptureError  # noqa: E402

NPU = "npu:0"
BS, NB, HEADS, KV_HEADS, D = 128, 4, 4, 2, 128


def attention_step(q, kc, vc, bt, kv_lens, w):
    """A decode-shaped piece of a layer: fused attention over the paged cache, then a projection and a norm."""
    out = torch_npu.npu_fused_infer_attention_score(
        q, kc.view(NB, BS, -1), vc.view(NB, BS, -1), atten_mask=MASK, actual_seq_lengths=list(range(1, q.shape[0] + 1)),
        actual_seq_lengths_kv=kv_lens, block_table=bt, num_heads=HEADS, scale=D ** -0.5, input_layout="TND",
        num_key_value_heads=KV_HEADS, sparse_mode=3, block_size=BS)[0]
    y = out.reshape(q.shape[0], -1) @ w
    return torch_npu.npu_rms_norm(y, torch.ones(y.shape[-1], dtype=y.dtype, device=y.device))[0]


MASK = None


def setup():
    global MASK
    MASK = torch.triu(torch.ones(2048, 2048, dtype=torch.int8), 1).to(NPU)
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(NB, BS, KV_HEADS, D, generator=g).bfloat16().to(NPU)
    vc = torch.randn(NB, BS, KV_HEADS, D, generator=g).bfloat16().to(NPU)
    w = torch.randn(HEADS * D, 64, generator=g).bfloat16().to(NPU)
    bt = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32).to(NPU)
    q = torch.zeros(2, HEADS, D, dtype=torch.bfloat16).to(NPU)
    return g, kc, vc, w, bt, q


def test_replay_with_updated_lengths_equals_eager_and_without_the_update_keeps_the_captured_ones():
    g, kc, vc, w, bt, q = setup()
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph, auto_dispatch_capture=True):
        out = attention_step(q, kc, vc, bt, [200, 50], w)
    assert graph.num_nodes > 3
    for lens in ([200, 50], [130, 7], [256, 128]):
        q.copy_(torch.randn(2, HEADS, D, generator=g).bfloat16().to(NPU))
        graph.update([{"actual_seq_lengths_kv": lens}])
        graph.replay()
        assert torch.equal(out.cpu(), attention_step(q, kc, vc, bt, lens, w).cpu())
    # without update, the tiling's lengths are the last ones the graph was given, whatever the step needs now
    q.copy_(torch.randn(2, HEADS, D, generator=g).bfloat16().to(NPU))
    graph.replay()
    assert torch.equal(out.cpu(), attention_step(q, kc, vc, bt, [256, 128], w).cpu())
    assert not torch.equal(out.cpu(), attention_step(q, kc, vc, bt, [100, 9], w).cpu())


def test_capture_refuses_host_synchronisation_and_update_needs_auto_dispatch():
    _, kc, vc, w, bt, q = setup()
    for forbidden in (lambda y: y.sum().item(), lambda y: y.cpu(), lambda y: torch.npu.synchronize(),
                      lambda y: y + torch.ones(64).to(NPU)):
        with pytest.raises(GraphCaptureError, match="not allowed while an NPU graph is being captured"):
            with torch.npu.graph(torch.npu.NPUGraph()):
                forbidden(attention_step(q, kc, vc, bt, [10, 10], w))
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):  # no auto_dispatch_capture: the lengths cannot be updated
        attention_step(q, kc, vc, bt, [10, 10], w)
    with pytest.raises(RuntimeError, match="does not support update"):
        graph.update([{"actual_seq_lengths_kv": [11, 11]}])
    assert torch.npu.is_current_stream_capturing() is False


def signature(out):
    o = out.outputs[0]
    return o.token_ids, [(lp.token_id, lp.logprob, tuple(lp.top)) for lp in o.logprobs]


@pytest.mark.parametrize("variant", ["qwen3_hd128", "llama_hd64"])
def test_decode_graphs_give_the_eager_steps_bits(tmp_path, tok, variant):
    make_checkpoint(tmp_path, variant)
    arrivals = [(0, "a", list(range(10, 150)), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                              logprobs=3)),
                (0, "b", [5, 6, 7], SamplingParams(max_tokens=9, temperature=0.8, seed=4, ignore_eos=True,
                                                   logprobs=3)),
                (2, "c", list(range(40, 70)), SamplingParams(max_tokens=7, temperature=0, ignore_eos=True,
                                                             logprobs=3)),
                (5, "d", list(range(1, 200)), SamplingParams(max_tokens=5, temperature=0.7, top_k=20, seed=1,
                                                             ignore_eos=True, logprobs=3))]
    graphed = engine(tmp_path, tok, "npu")
    graphs, replays = graphed.runner.graphs, []

    class Counted:  # the runner's graphs, counting the steps they run
        runs = staticmethod(graphs.runs)

        def __call__(self, batch):
            replays.append(len(batch.q_lens))
            return graphs(batch)

    graphed.runner.graphs = Counted()
    with_graphs = run_all(graphed, arrivals)
    eager = run_all(engine(tmp_path, tok, "npu", device_options={"npu_graph": "off"}), arrivals)
    for rid in "abcd":
        assert signature(with_graphs[rid]) == signature(eager[rid]), rid
    assert len(replays) >= 8 and set(graphs.captured) >= {next(s for s in graphs.sizes if s >= n) for n in replays}
    assert max(replays) >= 3  # steps of several sequences, padded to a captured size
    assert graphed.stats()["kv_used_blocks"] == 0
