"""PoolerConfig: how a model pools its hidden states, as the checkpoint defines it: sentence-transformers'
modules.json and 1_Pooling/config.json where present (mean, CLS or last token; a Normalize module), else vLLM's
default for decoders (last token, normalised embeddings; a classifier's scores are never normalised).
--pooler_config overrides."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional, Union

TYPES = ("LAST", "MEAN", "CLS")
_ST_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS"}


@dataclass(frozen=True)
class PoolerConfig:
    pooling_type: str = "LAST"
    normalize: bool = True

    def __post_init__(self):
        if self.pooling_type not in TYPES:
            raise ValueError(f"pooling_type: {self.pooling_type!r} is not one of {', '.join(TYPES)}")

    @classmethod
    def for_model(cls, path: Optional[str], head: str, override: Union[str, dict, None] = None) -> "PoolerConfig":
        base = cls._sentence_transformers(path) if path and os.path.isdir(path) else None
        if base is None:  # vLLM's default for an embedding from a decoder (a base model or a converted LM)
            base = cls("LAST", True)
        if override is None:
            return base
        fields = json.loads(override) if isinstance(override, str) else dict(override)
        unknown = sorted(set(fields) - {"pooling_type", "normalize"})
        if unknown:
            raise ValueError(f"pooler_config: unknown keys {', '.join(unknown)} (pooling_type, normalize)")
        return cls(str(fields.get("pooling_type", base.pooling_type)).upper(),
                   bool(fields.get("normalize", base.normalize)))

    @classmethod
    def _sentence_transformers(cls, path: str) -> Optional["PoolerConfig"]:
        modules_path = os.path.join(path, "modules.json")
        if not os.path.isfile(modules_path):
            return None
        with open(modules_path) as f:
            modules = json.load(f)
        pooling = next((m for m in modules if m.get("type", "").endswith(".Pooling")), None)
        normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
        if pooling is None:
            return cls("LAST", normalize)
        with open(os.path.join(path, pooling.get("path", "1_Pooling"), "config.json")) as f:
            st = json.load(f)
        modes = [key for key, on in st.items() if key.startswith("pooling_mode_") and on]
        if len(modes) != 1 or modes[0] not in _ST_MODES:
            raise ValueError(f"{path}: the sentence-transformers pooling must be one of mean, CLS or last token "
                             f"(got {', '.join(modes) or 'none'})")
        return cls(_ST_MODES[modes[0]], normalize)


def runs_pooling(runner: str, model_config) -> bool:
    """--runner pooling, or auto on a checkpoint without an LM head (or read as a classifier from its LM head)."""
    return runner == "pooling" or (runner == "auto" and (model_config.head != "lm"
                                                         or model_config.classifier_from_token is not None))
