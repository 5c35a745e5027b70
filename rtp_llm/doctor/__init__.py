"""python -m rtp_llm.doctor: the self-check before serving on a machine (device, drivers, CANN, torch_npu, /dev/shm,
a one-operator smoke test, the custom operators), then the preflight of a model and its flags on that device."""

from rtp_llm.doctor.checks import FAIL, PASS, WARN, Check, device_checks
from rtp_llm.doctor.preflight import preflight

__all__ = ["Check", "PASS", "WARN", "FAIL", "device_checks", "preflight", "run"]


def run(argv=None) -> tuple[int, list[Check]]:
    from rtp_llm.doctor.__main__ import run as _run

    return _run(argv)
