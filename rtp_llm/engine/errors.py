"""Errors the engine raises to its callers (the server maps them to HTTP 4xx)."""


class RequestRejected(ValueError):
    """The request can never be served as asked (too long for max_model_len or the KV pool, bad ids)."""


class QueueFullError(RuntimeError):
    """The waiting queue is at max_queue_len; retry later."""


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (after a fatal error or shutdown)."""
