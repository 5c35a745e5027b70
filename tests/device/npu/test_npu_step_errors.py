"""On the (emulated) NPU, a fused-attention failure caused by one request's input: that request ends with the
request id, the layer, the torch_npu operator and the operator's own message; the rest of its batch finishes with the
tokens it gives alone."""

from tests.npu_emulator.install import install

torch_npu = install()

from rtp_llm.sampling import SamplingParams  # noqa: E402
from tests.device.npu.helpers import engine, tok  # noqa: E402,F401
from tests.engine.helpers import run_all  # noqa: E402
from tests.models.tiny_checkpoints import make_checkpoint  # noqa: E402
from torch_npu._ops import NPUOpError  # noqa: E402

POISON = 45


def test_a_fused_attention_failure_names_its_request_layer_and_operator(tmp_path, tok, monkeypatch):
    make_checkpoint(tmp_path, "qwen3_hd128")
    greedy = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    prompts = {"ok": list(range(10, 40)), "bad": list(range(50, 50 + POISON))}
    alone = run_all(engine(tmp_path, tok, "npu"), [(0, "ok", prompts["ok"], greedy)])["ok"].outputs[0].token_ids
    real = torch_npu.npu_fused_infer_attention_score

    def fia(*args, **kwargs):
        if POISON in kwargs.get("actual_seq_lengths_kv", []):
            raise NPUOpError("npu_fused_infer_attention_score", "EZ1001: actual_seq_lengths_kv value 45 is invalid")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_npu, "npu_fused_infer_attention_score", fia)
    eng = engine(tmp_path, tok, "npu")
    outs = run_all(eng, [(0, rid, p, greedy) for rid, p in prompts.items()])
    msg = outs["bad"].error
    assert outs["bad"].outputs[0].finish_reason == "error"
    assert msg.startswith("step of request bad failed in layer 0, operator npu_fused_infer_attention_score")
    assert "EZ1001: actual_seq_lengths_kv value 45 is invalid" in msg
    assert outs["ok"].outputs[0].token_ids == alone and eng.stats()["kv_used_blocks"] == 0
