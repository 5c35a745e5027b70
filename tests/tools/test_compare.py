"""rtp_llm.tools.compare on the CPU: identical sides report zeros; GGUF blocks as stored against the dequantized file
report zeros; the engine against transformers on the same float32 weights is within tolerance everywhere; a weight
perturbed on one side only is the first layer flagged; the command line writes its JSON, PNG and safetensors."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from rtp_llm.models.default_model import default_model_path
from rtp_llm.tools.compare import Side, compare as run_compare, main
from tests.models.tiny_checkpoints import make_checkpoint
from tests.models.tiny_gguf import write_tiny_gguf

PROMPT = [3, 17, 101, 45, 9, 77, 12]


def compare(*args, **kw):  # the tiny checkpoints have no tokenizer: the default model's (the prompt is ids)
    return run_compare(*args, tokenizer=default_model_path(), **kw)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    make_checkpoint(path, "qwen3_gqa2_headdim32_untied")
    return str(path)


def names_of(report, step):
    return [x.name for x in report.layers if x.step == step]


def test_the_same_side_twice_reports_zeros_for_every_layer_and_step(tiny):
    report, base, _ = compare(tiny, PROMPT, "cpu:float32", "cpu:float32", steps=3)
    assert report.first_out_of_tolerance is None and report.first_token_difference is None
    assert report.compared_steps == 4 and len(base.forwards) == 4
    layers = base.forwards[0]
    # model order: the embedding, three outputs per decoder layer, the final norm and the logits
    assert list(layers) == ["embedding", "layers.0.attention", "layers.0.mlp", "layers.0.residual",
                            "layers.1.attention", "layers.1.mlp", "layers.1.residual", "norm", "logits"]
    assert layers["embedding"].shape[0] == len(PROMPT) and base.forwards[1]["embedding"].shape[0] == 1
    assert all(x.max_abs == 0 and x.cosine == pytest.approx(1.0) for x in report.layers)


def test_the_engine_matches_transformers_layer_by_layer(tiny):
    report, base, ref = compare(tiny, PROMPT, "transformers:float32", "cpu:float32", steps=3)
    assert report.first_out_of_tolerance is None, report.first_out_of_tolerance
    assert report.first_token_difference is None and report.compared_steps == 4
    assert names_of(report, 0) == list(base.forwards[0])  # every point captured on both sides
    assert max(x.max_rel for x in report.layers) < 1e-4   # float32 against float32: summation order only


def test_a_perturbed_weight_is_the_first_layer_flagged(tiny, tmp_path):
    """The candidate runs a copy of the checkpoint whose layer-1 MLP down projection is scaled by 1.5: that layer's
    MLP output is the first point out of tolerance, and nothing before it moved."""
    perturbed = tmp_path / "perturbed"
    shutil.copytree(tiny, perturbed)
    weights = load_file(str(perturbed / "model.safetensors"))
    weights["model.layers.1.mlp.down_proj.weight"] *= 1.5
    save_file(weights, str(perturbed / "model.safetensors"), metadata={"format": "pt"})
    report, _, _ = compare(tiny, PROMPT, "cpu:float32", "cpu:float32", steps=2, candidate_model=str(perturbed))
    assert report.first_out_of_tolerance == {"step": 0, "name": "layers.1.mlp"}
    before = [x for x in report.layers if x.step == 0][: names_of(report, 0).index("layers.1.mlp")]
    assert before and all(x.max_abs == 0 for x in before)


def test_gguf_blocks_as_stored_against_the_dequantized_file_report_zeros(tmp_path):
    path = write_tiny_gguf(str(tmp_path / "t.gguf"), "Q4_K", with_vocab=False)
    report, stored, dense = compare(path, PROMPT, "cpu:float32:none", "cpu:float32:stored", steps=2)
    assert all(x.max_abs == 0 for x in report.layers) and report.first_token_difference is None
    assert report.compared_steps == 3


def test_the_command_line_writes_the_json_the_plot_and_both_sides_tensors(tiny, tmp_path, capsys):
    out_json, png, dump = tmp_path / "r.json", tmp_path / "r.png", tmp_path / "dump"
    rc = main(["--model", tiny, "--token_ids", ",".join(map(str, PROMPT)), "--baseline", "transformers:float32",
               "--candidate", "cpu:bfloat16", "--steps", "2", "--tokenizer", default_model_path(), "--json", str(out_json), "--plot", str(png),
               "--dump", str(dump)])
    table = capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert rc == (0 if report["first_out_of_tolerance"] is None else 1)
    assert report["baseline"] == "transformers:float32" and report["candidate"] == "cpu:bfloat16"
    assert report["tolerance"]["dtype"] == "torch.bfloat16" and len(report["layers"]) >= 9
    assert "first out of tolerance" in table and "layers.1.residual" in table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    base, cand = load_file(str(dump / "baseline.safetensors")), load_file(str(dump / "candidate.safetensors"))
    assert set(base) == set(cand) and "step0.layers.0.attention" in base
    assert base["step0.embedding"].shape[0] == len(PROMPT) and base["step1.embedding"].shape[0] == 1
    assert not torch.equal(base["step0.layers.1.mlp"], cand["step0.layers.1.mlp"])  # float32 against bf16


@pytest.mark.parametrize("spec,needle", [("gpu:float32", "DEVICE cpu, cuda or npu"), ("cpu:float64", "dtype"),
                                         ("cpu:float32:fp8", "quantization"), ("transformers:float32:none", "dtype only")])
def test_a_bad_side_is_a_clear_error(spec, needle):
    with pytest.raises(ValueError, match=needle):
        Side.parse(spec)


def test_tensor_parallel_two_against_one_is_within_tolerance(tiny):
    """The candidate on 2 tensor-parallel ranks (rank 0 observed: attention and MLP outputs are whole after their
    all-reduce, the logits after their gather) against one process: float32 within tolerance everywhere, logits
    included, the same greedy tokens."""
    report, base, cand = compare(tiny, PROMPT, "cpu:float32", "cpu:float32", steps=2, candidate_tp=2)
    assert report.first_out_of_tolerance is None and report.first_token_difference is None
    assert report.compared_steps == 3 and list(cand.forwards[0]) == list(base.forwards[0])  # logits gathered
    assert names_of(report, 0) == list(base.forwards[0]) and names_of(report, 0)[-1] == "logits"
    assert max(x.max_rel for x in report.layers) < 1e-4
