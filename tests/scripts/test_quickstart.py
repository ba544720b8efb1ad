"""The README's main command as a newcomer runs it: a fresh venv, a copy of the repository,
`bash scripts/quickstart.sh`.

What a newcomer relies on: the script installs everything its own commands need (a fresh venv
without system site packages has nothing else), it exits 0 and writes the report, nothing is
downloaded at run time (the hub is switched off; pip installs are the only downloads), and the
run shows learning: the starter tier's mean no-hint reward rises from the first round to the last.
Slow: pip fills the new venv (from the machine's wheel caches where it has them), then the whole
recipe runs.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
RUN = Path("runs") / "quickstart"


def copy_repository(destination: Path) -> None:
    """The files a clone would have plus the ones not committed yet (never runs/ or caches)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell the repository's files from its outputs")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def fresh_venv_environment(venv: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PIP_NO_COMPILE="1")  # byte-compiling torch at install is a minute of CPU
    return env


def mean_no_hint_reward(run_dir: Path) -> dict[int, float]:
    """Per round: the mean reward of the no-hint plays (`r<NN>/rollout/` shards)."""
    means = {}
    for directory in sorted(run_dir.glob("r[0-9][0-9]/rollout")):
        rewards = [json.loads(line)["reward"] for shard in sorted(directory.glob("rollout-*.jsonl"))
                   for line in shard.read_text().splitlines() if line.strip()]
        if rewards:
            means[int(directory.parent.name[1:])] = sum(rewards) / len(rewards)
    return means


@pytest.mark.slow
@pytest.mark.e2e
def test_quickstart_runs_in_a_fresh_venv_and_shows_learning(tmp_path, nsjail_ok):
    repo, venv = tmp_path / "spade", tmp_path / "venv"
    copy_repository(repo)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log = tmp_path / "quickstart.log"
    with log.open("wb") as out:
        done = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=repo, stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env=fresh_venv_environment(venv), timeout=1200)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    assert done.returncode == 0, tail
    assert (repo / RUN / "report" / "index.html").is_file(), tail
    means = mean_no_hint_reward(repo / RUN)
    assert len(means) >= 2, means
    assert means[max(means)] >= means[min(means)] + 0.15, means
