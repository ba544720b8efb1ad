"""benchmarks/gpu.sh, the GPU check, in its CPU smoke mode: it runs when a GPU is lent, rarely
and with minutes to spare, so a step broken by a change elsewhere must show up here first.

What the person holding the GPU relies on: the script is valid shell; `--dry-run` runs the
same sections at tiny sizes on CPU and exits 0 with the table; the sections that can run on
CPU (kernels, the FSDP2 path, the resident refill) give numbers, not a "failed" row; vLLM's own
sections say why they are skipped; the recipe the serve section writes is one `spade run`
accepts. Slow: models built and trained on CPU.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
SCRIPT = REPO / "benchmarks" / "gpu.sh"


def test_gpu_sh_is_valid_shell():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (bash -n passed)")
    done = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("dry_run", [True, False])
def test_the_serve_sections_recipe_loads(tmp_path, dry_run):
    """The recipe the check writes for `spade run`: a key spade refuses would cost the section
    (and the GPU minutes it ran in) at its first line."""
    sys.path.insert(0, str(REPO))
    from benchmarks import gpu
    from spade_cli import recipe as recipes

    s = gpu.settings(type("Args", (), {"dry_run": dry_run, "shape": "qwen3-1.7b"})())
    path = gpu.serve_recipe(tmp_path / "serve", str(tmp_path / "model"), s, "none",
                            sys.executable)
    recipe = recipes.load(str(path))
    assert recipe.rounds == 2 and recipe.serve is not None
    train = next(stage for stage in recipe.stages if stage.command == "train-grpo")
    assert train.options["micro-batch-tokens"] == s["serve_micro"] >= 4096


@pytest.mark.slow
@pytest.mark.e2e
def test_dry_run_prints_the_table_with_numbers(tmp_path):
    env = {**os.environ, "SPADE_GPU_WORK": str(tmp_path / "work")}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--skip", "serve",
                           "--out", str(tmp_path / "out"), "--budget", "1500"],
                          capture_output=True, text=True, env=env, timeout=1800)
    log = (tmp_path / "out" / "sections.log")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "spade GPU check on CPU (dry run)" in done.stdout
    results = json.loads((tmp_path / "out" / "gpu.json").read_text())["results"]
    failed = {name: r["skipped"] for name, r in results.items()
              if "skipped" in r and "vllm not installed" not in r["skipped"]
              and r["skipped"] != "--skip"}
    assert not failed, f"{failed}\n{log.read_text()[-4000:] if log.exists() else ''}"
    for kernels in results["kernels"]["attention"].values():
        assert kernels["mask"]["ms"] > 0 and kernels["packed"]["ms"] > 0
    assert [row["batch"] for row in results["kernels"]["sampler"]] == [16, 4]
    fsdp = results["fsdp"]
    assert [seen[2] for seen in fsdp["temperature_seen"]] == [pytest.approx(0.6)]
    for case in fsdp["cases"].values():
        assert set(case["planned"]) == set(case["measured"]) and \
            all(value > 0 for value in case["planned"].values())
    assert fsdp["step"]["tokens_per_s"] > 0
    resident = results["resident"]
    assert resident["from_memory"] == ["policy", "KL anchor"]
    assert resident["max_weight_difference"] < 1e-6
    assert "mask / packed" in done.stdout and "optimizer step: MFU" in done.stdout
    assert re.search(r"rollout\s+vllm rollout tokens/s\s+-\s+skipped: vllm not installed",
                     done.stdout)
    # then the tests marked gpu: collected, and on CPU skipped with the reason
    tests_log = (tmp_path / "out" / "gpu-tests.log").read_text()
    assert "a gpu test: torch sees no CUDA device here" in tests_log
    assert re.search(r"\b[4-9] skipped", tests_log), tests_log[-2000:]
