"""Loads the C++ extension rtp_llm._C with an error that says how to build it."""

try:
    from rtp_llm import _C  # noqa: F401  (re-exported)
except ImportError as exc:  # pragma: no cover - exercised only on an unbuilt checkout
    raise ImportError(
        "rtp_llm/_C.so (the C++ runtime) is not built or does not load: run `bash scripts/setup.sh`, "
        "or `bazel build //rtp_llm:_C.so && cp -f bazel-bin/rtp_llm/_C.so rtp_llm/` "
        f"(cause: {exc})"
    ) from exc

__all__ = ["_C"]
