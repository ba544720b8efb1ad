#!/usr/bin/env bash
# The trainer's tests once more, under the newest transformers vLLM 0.33 accepts (its pin is
# >=5.16.1,<5.21.0): a GPU user's one-venv install trains on that, the rest of the suite on 5.25.
# Its own venv under ~/.cache, kept between runs and rebuilt when pyproject.toml changes;
# torch==2.13.0 goes in first, so pip never resolves a CUDA torch. It skips, saying why, only
# where that transformers cannot be downloaded (no package index); anything else that fails fails.
# scripts/test.sh runs it after the suite; arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
TRANSFORMERS=5.20.2
TESTS=(tests/stages/train/test_loop.py tests/stages/train/test_policy.py
       tests/stages/train/test_grpo.py tests/stages/train/test_samples.py
       tests/stages/train/test_packing.py tests/stages/train/test_attention.py
       tests/stages/train/test_offload.py tests/stages/train/test_checkpoint.py
       tests/stages/train/test_parallel.py tests/stages/train/test_ranks.py)
# What these do is torch's alone (rendezvous, offload, rank deaths, a second resident rank):
# the suite has run them; leaving them out here halves this run. A --deselect is a prefix of
# the test's id: "[2" names every parametrization with two ranks.
DESELECT=(test_parallel.py::test_a_two_node_rendezvous_on_loopback_trains_as_one_rank
          test_parallel.py::test_two_offloaded_ranks_make_the_same_update
          test_parallel.py::test_a_killed_rank_is_one_line_and_exit_69_with_no_checkpoint
          "test_ranks.py::test_resident_ranks_train_what_new_processes_train[2"
          test_ranks.py::test_a_trainer_that_dies_is_exit_69)

cache="${XDG_CACHE_HOME:-$HOME/.cache}/spade-test-venvs"
venv="$cache/venv-transformers-$TRANSFORMERS-$(sha256sum pyproject.toml | cut -c1-12)"
pip_install() { "$venv/bin/python" -m pip install -qq --disable-pip-version-check "$@"; }

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9   # one build at a time (worktrees share the cache); runs share the built venv
if [ ! -e "$venv/complete" ]; then
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      "transformers==$TRANSFORMERS" -d "$wheels" >/dev/null 2>&1; then
    echo "test-versions: SKIPPED: transformers==$TRANSFORMERS cannot be downloaded here (no" \
         "package index?), so the trainer's tests ran under one transformers only" >&2
    exit 0
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  pip_install torch==2.13.0
  # spade's dependencies with `train`'s, not spade: the tests import this checkout (PYTHONPATH)
  python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["train"]))' >"$wheels/needs.txt"
  pip_install pytest "$wheels"/transformers-*.whl -r "$wheels/needs.txt"
  touch "$venv/complete"
fi
touch "$venv"   # in use: the sweep of venvs unused for two days spares it
find "$cache" -maxdepth 1 -name 'venv-transformers-*' -mtime +1 -exec rm -rf {} +
exec 9>&-

echo "test-versions: the trainer's tests under transformers $TRANSFORMERS, the newest vLLM 0.33 takes"
PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -q -rs "${TESTS[@]}" \
  "${DESELECT[@]/#/--deselect=tests/stages/train/}" "$@"
