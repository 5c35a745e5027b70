"""One command on an Ascend machine, one report to paste back:

    python -m tests.device.npu_hardware.report [--junit FILE]

prints the stack (npu-smi's header, CANN's version file, torch, torch_npu, the device name) and each smoke check's
PASS / FAIL / SKIP with its first failing line; exits non-zero if any check failed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def stack() -> list[str]:
    lines = []
    try:
        smi = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=30).stdout.splitlines()
        lines += ["npu-smi: " + s.strip() for s in smi[:4] if s.strip()]
    except (OSError, subprocess.SubprocessError) as exc:
        lines.append(f"npu-smi: not available ({exc})")
    from rtp_llm.device.npu.self_check import check_cann_environment

    cann = check_cann_environment()
    lines.append(f"CANN: {cann.detail}")
    code = ("import torch; print('torch', torch.__version__)\n"
            "import torch_npu; print('torch_npu', torch_npu.__version__)\n"
            "print('device', torch.npu.get_device_name(0) if torch.npu.is_available() else 'none visible')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines += res.stdout.splitlines()
    if "torch_npu" not in res.stdout:
        lines.append("torch_npu: does not import: " + (res.stderr.strip().splitlines() or ["?"])[-1])
    from rtp_llm.device.npu import versions

    lines.append(f"checked against: torch {versions.TORCH}, torch_npu {versions.TORCH_NPU}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--junit", default=None, help="also keep pytest's JUnit XML here")
    args = ap.parse_args(argv)
    junit = args.junit or os.path.join(tempfile.mkdtemp(), "npu_smoke.xml")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                    os.path.join(HERE, "test_smoke.py")], cwd=ROOT)
    print("\n=== rtp-llm NPU smoke report ===")
    for line in stack():
        print(line)
    failed = 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        status, detail = "PASS", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                status = "SKIP" if tag == "skipped" else "FAIL"
                detail = (node.get("message") or "").splitlines()[0][:160] if node.get("message") else ""
        failed += status == "FAIL"
        print(f"{status:4}  {case.get('name')}" + (f"  -- {detail}" if detail else ""))
    print(f"=== {'FAILED' if failed else 'OK'}: {failed} failed ===")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
