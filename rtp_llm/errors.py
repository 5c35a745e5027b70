"""The typed errors every layer of rtp-llm raises. Each message names the problem (the file, tensor, field,
flag or rank); callers map them to exit codes (start_server) or HTTP statuses (the server).

The KV-cache core's own errors come from C++: rtp_llm.cache.OutOfBlocksError and SequenceError.
"""


# --- configuration -----------------------------------------------------------------------------------------
class ConfigError(ValueError):
    """A setting has a bad value; the message names the flag or environment variable."""


# --- checkpoints -------------------------------------------------------------------------------------------
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


class LoRAError(CheckpointError):
    """A LoRA adapter that cannot be served on this base model: its message names the problem."""


class ChatTemplateError(ValueError):
    """The chat template rejected the messages (its own raise_exception), or failed to render."""


# --- devices -----------------------------------------------------------------------------------------------
class DeviceError(RuntimeError):
    """The requested device is not available here; the message says why."""


# --- tensor parallelism ------------------------------------------------------------------------------------
class ShardingError(ValueError):
    """The model cannot be split over this many ranks; the message says why."""


class LaunchError(ValueError):
    """The distributed environment is inconsistent; the message names the variable."""


class TPWorkerError(RuntimeError):
    """A tensor-parallel rank died or stopped answering; the message names it where known."""


# --- requests ----------------------------------------------------------------------------------------------
class RequestRejected(ValueError):
    """The request can never be served as asked (too long for max_model_len or the KV pool, bad ids). `param`: the
    request field at fault, where one is (the server's error body names it)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class QueueFullError(RuntimeError):
    """The waiting queue is at max_queue_len; retry later."""


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (after a fatal error or shutdown)."""
