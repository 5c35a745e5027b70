#!/usr/bin/env bash
# Installs everything and runs every test: the Bazel suites (gtest + pytest targets), then the
# tests that drive Bazel itself (they cannot run inside `bazel test`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bazel test //...
# The kernels' tests again, kernels built with AddressSanitizer (.bazelrc: asan): a read past a buffer's end fails
# here at once instead of crashing a server now and then. Python loads the runtime first (LD_PRELOAD), and
# libstdc++ with it so that the sanitizer finds the C++ exception machinery torch throws through.
asan_preload="$(gcc -print-file-name=libasan.so):$(g++ -print-file-name=libstdc++.so.6)"
bazel test --config=asan --test_env=LD_PRELOAD="$asan_preload" //rtp_llm/cpp/... //tests/device/cpu/...
# The tests that read the source tree as git sees it (the house rules) or drive Bazel itself.
python3 -m pytest -q -p no:cacheprovider tests/test_house.py tests/build
