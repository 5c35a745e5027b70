"""rtp_llm.tools.compare across devices: the float32 CPU baseline against the (emulated) NPU in bfloat16 on a tiny
head-dim-128 model, every layer and decode step within bfloat16's tolerance, and the NPU's greedy tokens the CPU's."""

from tests.npu_emulator.install import install

install()

from rtp_llm.models.default_model import default_model_path  # noqa: E402
from rtp_llm.tools.compare import compare  # noqa: E402
from tests.models.tiny_checkpoints import make_checkpoint  # noqa: E402


def test_cpu_float32_against_the_npu_in_bfloat16_is_within_tolerance(tmp_path):
    make_checkpoint(tmp_path, "qwen3_hd128")
    prompt = list(range(40, 75))
    report, base, cand = compare(str(tmp_path), prompt, "cpu:float32", "npu:bfloat16", steps=3,
                                 tokenizer=default_model_path())
    assert report.first_out_of_tolerance is None, [x for x in report.layers if not x.within][:3]
    assert report.tolerance["dtype"] == "torch.bfloat16"
    assert report.compared_steps == 4 and len(report.layers) == 4 * len(base.forwards[0])
    # not vacuous: the NPU side really ran in bf16 (every hidden layer moved a little, none identically zero)
    assert all(x.max_abs > 0 for x in report.layers if x.name != "embedding")
    assert all(t.dtype.is_floating_point for t in cand.forwards[0].values())
