# rtp_llm first: its process settings (OMP_WAIT_POLICY, rtp_llm/__init__.py) apply only before torch loads.
import rtp_llm  # noqa: F401
