"""python -m rtp_llm.doctor [--device auto|cpu|cuda|npu] [--model M] [serving flags] [--json] [--no_generate]

Each line: PASS / WARN / FAIL, the check, what was seen, and for a warning or failure the fix. Exit status 0 only
when nothing failed. Serving flags are start_server's (--dtype, --block_size, --tp_size, --quantization, ...)."""

from __future__ import annotations

import argparse
import json
import sys

from rtp_llm.doctor.checks import FAIL, Check, device_checks


def run(argv=None) -> tuple[int, list[Check]]:
    from rtp_llm.config.server_args import engine_config, resolve
    from rtp_llm.doctor.preflight import preflight
    from rtp_llm.errors import ConfigError

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--json", action="store_true")
    own.add_argument("--no_generate", action="store_true")
    ours, rest = own.parse_known_args(argv)
    try:
        args = resolve(rest)
    except ConfigError as exc:
        return 2, [Check("flags", FAIL, str(exc), "python -m rtp_llm.start_server --help lists every flag")]
    device = args["device"]
    if device == "auto":
        from rtp_llm.device import resolve_device

        device = resolve_device("auto")
    from rtp_llm.device import DEVICE_CLASSES

    checks = device_checks(device)
    if DEVICE_CLASSES[device].available()[0]:  # the preflight loads onto the device: only where it is usable
        try:
            checks += preflight(engine_config(args, device), device, generate=not ours.no_generate)
        except ConfigError as exc:
            checks.append(Check("flags", FAIL, str(exc), "python -m rtp_llm.start_server --help"))
    return (1 if any(c.status == FAIL for c in checks) else 0), checks


def main(argv=None) -> int:
    code, checks = run(argv)
    if "--json" in (argv if argv is not None else sys.argv[1:]):
        print(json.dumps({"ok": code == 0, "checks": [c.to_json() for c in checks]}, indent=1))
        return code
    for c in checks:
        print(f"{c.status.upper():4}  {c.name}: {c.detail}")
        if c.fix and c.status != "pass":
            print(f"      fix: {c.fix}")
    failed = sum(c.status == FAIL for c in checks)
    print(f"{'OK' if code == 0 else 'FAILED'}: {failed} failed, {sum(c.status == 'warn' for c in checks)} warnings, "
          f"{len(checks)} checks")
    return code


if __name__ == "__main__":
    sys.exit(main())
