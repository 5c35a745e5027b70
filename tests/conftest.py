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
