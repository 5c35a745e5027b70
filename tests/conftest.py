"""Shared pytest set-up: deterministic hypothesis runs that write nothing outside the sandbox."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "rtp_llm",
    database=None,
    deadline=None,
    derandomize=os.environ.get("HYPOTHESIS_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("rtp_llm")

# Two tiers (README, "Tests"): tests that start server processes or other engines' processes, drive Bazel, or
# soak are `slow`; `pytest -m "not slow" tests` is the fast unit tier.
_SLOW_DIRS = ("server", "distributed", "build")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts processes (servers, tensor-parallel ranks, Bazel) or soaks")


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        parts = item.path.parts
        if "tests" in parts and parts[parts.index("tests") + 1] in _SLOW_DIRS:
            item.add_marker(pytest.mark.slow)


# Never reach for the Hugging Face Hub, and keep its caches inside the test's scratch space
# (Bazel's sandbox gives each test a writable TEST_TMPDIR; HOME may not be writable there).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "TEST_TMPDIR" in os.environ:
    os.environ.setdefault("HF_HOME", os.path.join(os.environ["TEST_TMPDIR"], "hf_home"))
