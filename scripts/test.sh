#!/usr/bin/env bash
# Installs everything and runs every test: the Bazel suites (gtest + pytest targets), then the
# tests that drive Bazel itself (they cannot run inside `bazel test`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bazel test //...
python3 -m pytest -q -p no:cacheprovider tests/build
