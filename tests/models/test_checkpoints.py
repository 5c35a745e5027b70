"""Checkpoint formats and the errors bad checkpoints raise (each names the problem)."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.errors import (CheckpointError, MissingFileError, MissingTensorError, ShapeMismatchError,
                                   UnknownArchitectureError, UnsafeCheckpointError)
from rtp_llm.models.registry import load_model
from tests.models.tiny_checkpoints import make_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    make_checkpoint(tmp_path, "qwen3_gqa2_headdim32_untied")
    return tmp_path


def _edit_config(path, **changes):
    cfg_file = path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    cfg_file.write_text(json.dumps(cfg))


def test_missing_path_and_missing_config(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match="config.json"):
        load_model(str(tmp_path / "empty"))


def test_unknown_architecture(ckpt):
    _edit_config(ckpt, architectures=["MambaForCausalLM"])
    with pytest.raises(UnknownArchitectureError, match="MambaForCausalLM"):
        load_model(str(ckpt))
    # --model_type overrides architectures.
    model, cfg = load_model(str(ckpt), model_type="qwen_3")
    assert cfg.architecture == "Qwen3ForCausalLM"
    with pytest.raises(UnknownArchitectureError, match="gpt_neox"):
        load_model(str(ckpt), model_type="gpt_neox")


def test_missing_tensor_is_named(ckpt):
    weights = load_file(str(ckpt / "model.safetensors"))
    del weights["model.layers.1.self_attn.k_norm.weight"]
    save_file(weights, str(ckpt / "model.safetensors"))
    with pytest.raises(MissingTensorError, match="model.layers.1.self_attn.k_norm.weight"):
        load_model(str(ckpt))


def test_shape_mismatch_names_tensor_and_both_shapes(ckpt):
    weights = load_file(str(ckpt / "model.safetensors"))
    weights["model.layers.0.mlp.up_proj.weight"] = torch.zeros(95, 64)
    save_file(weights, str(ckpt / "model.safetensors"))
    with pytest.raises(ShapeMismatchError, match=r"model.layers.0.mlp.up_proj.weight.*\(95, 64\).*\(96, 64\)"):
        load_model(str(ckpt))


def test_pickle_checkpoints_are_refused_unless_allowed(ckpt):
    weights = load_file(str(ckpt / "model.safetensors"))
    os.remove(ckpt / "model.safetensors")
    torch.save(weights, ckpt / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match="pickle"):
        load_model(str(ckpt))
    model, _ = load_model(str(ckpt), allow_pickle=True)
    assert torch.equal(model.embed, weights["model.embed_tokens.weight"])


def test_sharded_safetensors_and_missing_shard(ckpt):
    weights = load_file(str(ckpt / "model.safetensors"))
    os.remove(ckpt / "model.safetensors")
    names = sorted(weights)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(ckpt / file))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    model, _ = load_model(str(ckpt))
    assert torch.equal(model.layers[1].mlp.down.weight, weights["model.layers.1.mlp.down_proj.weight"])
    os.remove(ckpt / "model-00002-of-00002.safetensors")
    with pytest.raises(MissingFileError, match="model-00002-of-00002"):
        load_model(str(ckpt))


def test_no_weights_at_all(ckpt):
    os.remove(ckpt / "model.safetensors")
    with pytest.raises(MissingFileError, match="no weights"):
        load_model(str(ckpt))


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(CheckpointError):
        load_model(str(bad))


def test_dtype_conversion(ckpt):
    model, _ = load_model(str(ckpt), dtype="bfloat16")
    assert model.embed.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unsupported dtype"):
        load_model(str(ckpt), dtype="int8")


def test_transformers_4_and_5_config_dialects_agree():
    v5 = {"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "dtype": "bfloat16",
          "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    v4 = {k: v for k, v in v5.items() if k not in ("dtype", "rope_parameters")}
    v4.update({"torch_dtype": "bfloat16", "rope_theta": 500000.0,
               "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}})
    a, b = ModelConfig.from_hf_dict(v5), ModelConfig.from_hf_dict(v4)
    assert a == b
    assert a.rope.theta == 500000.0 and a.rope.type == "llama3" and a.dtype == torch.bfloat16
    assert a.head_dim == 4


def test_missing_config_field_is_named():
    with pytest.raises(CheckpointError, match="hidden_size"):
        ModelConfig.from_hf_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 10})
