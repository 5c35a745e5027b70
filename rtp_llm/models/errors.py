"""Errors raised while reading a checkpoint. Each names the problem and the file or tensor."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as given."""


class MissingFileError(CheckpointError, FileNotFoundError):
    """A required file (config.json, weights, tokenizer) is not there."""


class UnknownArchitectureError(CheckpointError):
    """The architecture / model_type is not one this engine implements."""


class MissingTensorError(CheckpointError):
    """A weight the architecture needs is absent from the checkpoint."""


class ShapeMismatchError(CheckpointError):
    """A weight has another shape than the config implies."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle checkpoint (.bin / .pt) was found and pickle loading was not allowed."""
