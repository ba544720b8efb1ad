"""The README's main command as a newcomer runs it: a copy of the repository and
`bash scripts/quickstart.sh`, with the machine's externally managed system Python (PEP 668: its pip
refuses to install) first on PATH where the machine has one, else inside a fresh venv.

What a newcomer relies on: the script installs everything its own commands need (into `.venv/`
in the clone when it is not in a venv, scripts/venv.sh; a fresh venv without system site packages
has nothing else), it exits 0 and writes the report, nothing is
downloaded at run time (the hub is switched off; pip installs are the only downloads), and the
run shows learning: every round's mean no-hint reward on the starter tier is at least 0.5 above
round 0's, and the report raises no training-collapse alert.
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


def externally_managed_python() -> Path | None:
    """A system python3 whose pip refuses installs (its stdlib holds PEP 668's marker), if any."""
    for candidate in (Path("/usr/bin/python3"), Path("/usr/local/bin/python3")):
        if not candidate.is_file():
            continue
        stdlib = subprocess.run([str(candidate), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                                capture_output=True, text=True, check=False).stdout.strip()
        if stdlib and (Path(stdlib) / "EXTERNALLY-MANAGED").is_file():
            return candidate
    return None


def newcomer_environment(bin_dir: Path, venv: Path | None) -> dict[str, str]:
    """PATH led by bin_dir; inside `venv` when one is given, else in no virtual environment."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PIP_NO_COMPILE="1")  # byte-compiling torch at install is a minute of CPU
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
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
def test_quickstart_installs_runs_and_shows_learning_on_a_fresh_machine(tmp_path, nsjail_ok):
    repo = tmp_path / "spade"
    copy_repository(repo)
    system = externally_managed_python()
    if system is not None:
        env = newcomer_environment(system.parent, venv=None)
        refused = subprocess.run(["python3", "-m", "pip", "install", "--dry-run", "pytest"],
                                 env=env, capture_output=True, text=True, check=False)
        assert refused.returncode != 0 and "externally-managed" in refused.stderr, refused.stderr
    else:
        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = newcomer_environment(venv / "bin", venv)
    log = tmp_path / "quickstart.log"
    with log.open("wb") as out:
        done = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=repo, stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                              timeout=1200)
    text = log.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-40:])
    assert done.returncode == 0, tail
    if system is not None:
        assert "installing into" in text and (repo / ".venv" / "bin" / "spade").is_file(), tail
    assert (repo / RUN / "report" / "index.html").is_file(), tail
    means = mean_no_hint_reward(repo / RUN)
    assert sorted(means) == [0, 1, 2, 3], means
    assert all(means[number] >= means[0] + 0.5 for number in (1, 2, 3)), means
    page = (repo / RUN / "report" / "index.html").read_text()
    assert 'id="alerts"' not in page, "the quickstart's report opens with a training-collapse box"
