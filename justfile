# Developer tasks. `pip install rust-just` gives the `just` binary if your system lacks it.

# Install spade with test extras (editable).
install:
    python -m pip install -e '.[test]'

# Run the test suite (CPU only; GPU tests are deselected).
test *opts:
    python -m pytest {{opts}}

# Regenerate the shipped seed env shard after editing a seed env.
seeds:
    spade seeds | spade validate > stages/seed_library/envs.jsonl.tmp
    mv stages/seed_library/envs.jsonl.tmp stages/seed_library/envs.jsonl

# Measure the sandbox: jail launch, round trips, validate throughput.
bench-sandbox:
    python benchmarks/sandbox.py
