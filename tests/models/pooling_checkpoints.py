"""Tiny random pooling checkpoints made with transformers (the embedded model's 49,152-token vocabulary, so its
real tokenizer reads their inputs): base models with each pooling kind, cross-encoders, a Qwen3-Reranker-style
causal LM."""

from __future__ import annotations

import json
import os

import torch

SIZE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)


def _sentence_transformers(path: str, mode: str, normalize: bool) -> None:
    """sentence-transformers' files saying how the model pools (modules.json, 1_Pooling/config.json)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": SIZE["hidden_size"], "pooling_mode_cls_token": mode == "cls",
                   "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
                   "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                   "pooling_mode_lasttoken": mode == "last", "include_prompt": True}, f)


def make_embedding_model(path, kind: str, seed: int = 0):
    """kind: last (Qwen3Model, no sentence-transformers files: vLLM's decoder default, last token, normalised),
    mean (LlamaModel, mean + Normalize), cls (Qwen2Model, CLS, not normalised). Returns the transformers model."""
    from transformers import LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model, Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    if kind == "last":
        model = Qwen3Model(Qwen3Config(**SIZE, head_dim=16))
    elif kind == "mean":
        model = LlamaModel(LlamaConfig(**SIZE))
    else:
        model = Qwen2Model(Qwen2Config(**SIZE))
    model.eval().save_pretrained(str(path))
    if kind != "last":
        _sentence_transformers(str(path), kind, normalize=kind == "mean")
    return model


def make_cross_encoder(path, num_labels: int = 1, seed: int = 1, labels=None):
    """labels: the classes' names (id2label); transformers' LABEL_i without."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(seed)
    names = {"id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}} if labels else {}
    model = Qwen2ForSequenceClassification(Qwen2Config(**SIZE, num_labels=num_labels, pad_token_id=0, **names)).eval()
    model.save_pretrained(str(path))
    return model


def make_yes_no_reranker(path, seed: int = 2):
    """A Qwen3 causal LM read as a reranker from its "yes" / "no" logits (Qwen3-Reranker's recipe)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**SIZE, head_dim=16, tie_word_embeddings=False)).eval()
    model.save_pretrained(str(path))
    return model
