"""The Ascend software the NPU path is written and checked against, in one place: the compile and signature checks
(tests/device/npu/test_torch_npu_api.py, tests/build/) read the torch_npu pin from requirements-torch-npu.txt and
hold it equal to TORCH_NPU; the NPU device logs a warning when the installed torch_npu is another release.

What "checked" means here: conformant to this torch_npu's operator schemas and docs and to the CANN operator source
below (the emulator's checks carry a tag pointing at each); never run on an NPU.
"""

TORCH = "2.13.0"
TORCH_NPU = "2.13.0"  # torch_npu X.Y.Z is built against torch X.Y.Z
# Ascend/pytorch's COMPATIBILITY.md (master of 2026-08-21) has no row for torch_npu 2.13.0 yet; its newest pairs
# torch_npu 2.12.0 (and 2.11.0) with CANN 9.1.0. Install the CANN your torch_npu release notes name.
CANN_TABLE_NEWEST = ("2.12.0", "9.1.0")
# CANN's open operator source the emulator's constraints and rounding points were read from (repository: commit, date)
CANN_OPERATOR_SOURCE = {
    "hicann/ops-transformer": ("c29bc1069d3252c641e2aa059ec88f392d3f05ac", "2025-11-15"),
    "hicann/ops-nn": ("e5c3fa9327ea95ba26d06227e746923580d10921", "2026-08-22"),
}
