# Developer tasks. `pip install rust-just` gives the `just` binary if your system lacks it.

# Install spade with everything the tests use (torch 2.13.0 CPU first).
install:
    python -m pip install torch==2.13.0
    python -m pip install -e '.[test]'

# Run the test suite (CPU only; GPU tests are deselected).
test *opts:
    python -m pytest {{opts}}

# The main job: the quickstart recipe, then its report.
quickstart:
    bash scripts/quickstart.sh

# Regenerate the shipped env shards (seed library, starter tier) after editing one of their envs.
seeds:
    spade seeds | spade validate --seed 0 > stages/seed_library/envs.jsonl.tmp
    mv stages/seed_library/envs.jsonl.tmp stages/seed_library/envs.jsonl
    spade seeds --starter | spade validate --seed 0 > stages/seed_library/starter/envs.jsonl.tmp
    mv stages/seed_library/starter/envs.jsonl.tmp stages/seed_library/starter/envs.jsonl
    spade seeds --examples | spade validate --seed 0 > stages/seed_library/examples/envs.jsonl.tmp
    mv stages/seed_library/examples/envs.jsonl.tmp stages/seed_library/examples/envs.jsonl

# Regenerate docs/cli.md from every command's --help (tests/scripts/test_cli_docs.py checks it).
cli-docs:
    python scripts/cli_docs.py

# Benchmarks: printed tables with same-run baselines.
bench-sandbox:
    python benchmarks/sandbox.py
bench-rollout:
    python benchmarks/rollout.py
bench-train:
    python benchmarks/train.py
bench-memory:
    python benchmarks/memory.py
bench-sampler:
    python benchmarks/sampler.py

# Find repeated code before committing.
duplicates:
    duplicates --change
