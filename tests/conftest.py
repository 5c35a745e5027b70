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

# Never reach for the Hugging Face Hub, and keep its caches inside the test's scratch space
# (Bazel's sandbox gives each test a writable TEST_TMPDIR; HOME may not be writable there).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "TEST_TMPDIR" in os.environ:
    os.environ.setdefault("HF_HOME", os.path.join(os.environ["TEST_TMPDIR"], "hf_home"))
