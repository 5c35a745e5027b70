#!/usr/bin/env bash
# Creates the llama.cpp peer for benchmarks.run (--engines ...,llamacpp) and benchmarks/spec_decode.py: llama.cpp
# built from the source vendored in the pinned llama-cpp-python sdist (CPU-native, one build: the shared library the
# Python binding loads through LLAMA_CPP_LIB_PATH, plus llama-batched-bench, llama-bench, llama-quantize,
# llama-lookup and llama-speculative), the binding in its own venv, and f32 / bf16 GGUF copies of the default model
# (llama-quantize dequantizes the packaged Q4_1 file, so every engine runs the same weights). About 15 minutes on
# 2 cores.
#   bash benchmarks/peers/setup_llamacpp.sh [DIR]     (default .venv-llamacpp in the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"
dir="${1:-.venv-llamacpp}"
version="$(sed -n 's/^llama-cpp-python==//p' benchmarks/peers/requirements-llamacpp.txt)"
python3 -m venv "$dir"
dir="$(cd "$dir" && pwd)"
"$dir/bin/pip" download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$dir/src"
tar -xzf "$dir/src/llama_cpp_python-$version.tar.gz" -C "$dir/src"
src="$dir/src/llama_cpp_python-$version"
cmake -S "$src/vendor/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF
# llama-lookup (n-gram lookup decoding) and llama-speculative (draft-model speculation): the peers of
# benchmarks/spec_decode.py.
cmake --build "$dir/build" -j "$(nproc)" --target llama llama-batched-bench llama-bench llama-quantize \
  llama-lookup llama-speculative
# The binding without its own copy of the library (LLAMA_BUILD=OFF): it loads $dir/build/bin/libllama.so.
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$dir/bin/pip" install --no-binary llama-cpp-python \
  -r benchmarks/peers/requirements-llamacpp.txt
gguf="$(PYTHONPATH="$root" python3 -c 'from rtp_llm.models.default_model import default_model_path as p; print(p())')"
for t in F32 BF16; do
  out="$dir/model-$(echo $t | tr A-Z a-z).gguf"
  [ -e "$out" ] || "$dir/build/bin/llama-quantize" --allow-requantize "$gguf" "$out" "$t"
done
LLAMA_CPP_LIB_PATH="$dir/build/bin" "$dir/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
