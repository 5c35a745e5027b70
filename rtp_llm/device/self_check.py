"""A self-check line (rtp_llm/doctor): pass / warn / fail, what was seen, and for anything short of a pass the fix.
Each device answers its own checks (Device.self_check); the doctor adds the machine's and the model's."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def ok(name: str, detail: str) -> Check:
    return Check(name, PASS, detail)
