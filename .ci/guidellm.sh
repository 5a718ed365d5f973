#!/usr/bin/env bash
# Install GuideLLM into a virtualenv of its own (.cache/venv-guidellm, git-ignored), for the
# real-engine test that runs it unchanged against the gateway (tests/realengine).
# Idempotent: does nothing when that virtualenv already runs the pinned GuideLLM.
#
# Why a virtualenv of its own: guidellm 0.8 pins click~=8.4 and pulls datasets, pandas, sanic and
# an older multidict; in the project virtualenv that would downgrade packages the gateway and
# vLLM import. It also requires torch: installing `torch==X` first takes the CPU wheel (a file on
# disk on CI machines, as in .ci/vllm-cpu.sh) instead of resolving a CUDA build.
set -euo pipefail

cd "$(dirname "$0")/.."
GUIDELLM_VENV="${GUIDELLM_VENV:-.cache/venv-guidellm}"
GUIDELLM_VERSION="${GUIDELLM_VERSION:-0.8.1}"
TORCH_CPU_VERSION="${TORCH_CPU_VERSION:-2.13.0}"
BASE_PY="${BASE_PY:-python3}"
PY="$GUIDELLM_VENV/bin/python"

say() { printf '[guidellm %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# pip warns once per package about index folders that hold no copy of it; that is noise.
pip_install() {
  "$PY" -m pip install --progress-bar off -q "$@" 2>&1 | { grep -v 'is ignored: it is neither' || true; }
}

probe() {
  "$PY" - "$GUIDELLM_VERSION" <<'PY' >/dev/null 2>&1
import importlib.metadata as md
import sys
assert md.version("guidellm") == sys.argv[1]
import guidellm.__main__  # noqa: F401  (the CLI the test runs)
PY
}

start_s=$(date +%s)
if [ -x "$PY" ] && probe; then
  say "guidellm $GUIDELLM_VERSION already installed in $GUIDELLM_VENV; nothing to do"
  exit 0
fi

if [ ! -x "$PY" ]; then
  say "creating $GUIDELLM_VENV"
  mkdir -p "$(dirname "$GUIDELLM_VENV")"
  "$BASE_PY" -m venv "$GUIDELLM_VENV"
fi

say "installing torch==$TORCH_CPU_VERSION (CPU build)"
pip_install "torch==$TORCH_CPU_VERSION"

say "installing guidellm==$GUIDELLM_VERSION"
pip_install "guidellm==$GUIDELLM_VERSION" "torch==$TORCH_CPU_VERSION"

say "checking the install"
if ! probe; then
  say "guidellm does not import; the error follows" >&2
  "$PY" -c "import guidellm.__main__" >&2
  exit 1
fi
"$PY" - <<'PY'
import importlib.metadata as md
for name in ("guidellm", "torch", "transformers", "httpx"):
    print(f"  {name} {md.version(name)}")
PY
say "done in $(( $(date +%s) - start_s )) s"
