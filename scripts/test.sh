#!/usr/bin/env bash
# The README's test command: install what the tests need, then run them (CPU only).
# torch comes first and pinned: a bare `torch` requirement resolved later would pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install torch==2.13.0
pip_install -e '.[test]'
python3 -m pytest -q "$@"
