#!/usr/bin/env bash
# The README's main command: install spade, run the quickstart recipe (the whole SPADE loop,
# offline, on CPU), then write the run's report. Rerunning resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install torch==2.13.0          # first: a later bare `torch` requirement would pull CUDA
pip_install -e '.[train,report,diversity]'
python3 -m spade_cli run recipes/quickstart.toml "$@"
python3 -m spade_cli report runs/quickstart
