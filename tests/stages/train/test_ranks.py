"""Resident ranks (`spade trainer`): rounds trained on ranks that stay up give the records and
checkpoints new processes give, the second round from memory; ranks that die are exit 69."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from stages.train import ranks as train_ranks  # noqa: E402

pytestmark = pytest.mark.slow
TRAIN = ["--lr", "1e-2", "--micro-batch-tokens", "40"]


@pytest.fixture(scope="module")
def plays_file(tmp_path_factory):
    from tests.stages.train.test_parallel import plays_file as make  # the same six 3-turn plays

    return make.__wrapped__(tmp_path_factory)


def train(*args):
    done = subprocess.run([sys.executable, "-m", "spade_cli", "train-grpo", *args, *TRAIN],
                          capture_output=True, text=True, timeout=300)
    return done


def two_rounds(plays, model, ckpt, *extra):
    first = train(str(plays), "-m", model, "--ckpt-dir", str(ckpt), *extra)
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(str(plays), "-m", str(ckpt / "step-000001"), "--ckpt-dir", str(ckpt),
                   "--round", "1", *extra)
    assert second.returncode == 0, second.stderr[-3000:]
    return [json.loads(run.stdout) for run in (first, second)], [first.stderr, second.stderr]


def exported(step):
    from safetensors.torch import load_file

    return load_file(str(step / "model.safetensors"))


@pytest.mark.parametrize("nproc, kl", [(1, []), (2, ["--kl-beta", "0.5"])])
def test_resident_ranks_train_what_new_processes_train(plays_file, tiny_model, tmp_path, nproc,
                                                       kl):
    """On two ranks with a KL anchor, which the resident ranks keep across rounds too."""
    cold, _ = two_rounds(plays_file, tiny_model, tmp_path / "cold",
                         *(["--nproc", str(nproc)] if nproc > 1 else []), *kl)
    jobs = tmp_path / "jobs"
    ranks = train_ranks.start(nproc, jobs)
    try:
        warm, said = two_rounds(plays_file, tiny_model, tmp_path / "warm", "--trainer",
                                str(jobs), *kl)
    finally:
        train_ranks.stop(ranks, jobs)
    assert ranks.returncode == 0
    for a, b in zip(cold, warm):
        assert a["stats"] == b["stats"]
    for step in ("step-000001", "step-000002"):
        a, b = exported(tmp_path / "cold" / step), exported(tmp_path / "warm" / step)
        assert all(torch.equal(a[k], b[k]) for k in a)
    # the second round started from the state the first left in memory, not from disk
    memory = "policy, KL anchor" if kl else "policy"
    assert "memory" not in said[0] and f"started from the trainer's memory ({memory})" in said[1]
    if kl:
        assert warm[1]["stats"]["kl_ref"] > 0  # the second round's policy left its anchor


def test_a_trainer_that_dies_is_exit_69(plays_file, tiny_model, tmp_path):
    jobs = tmp_path / "jobs"
    ranks = train_ranks.start(1, jobs)
    train_ranks.ready(jobs)
    ranks.kill()  # torchrun; its ranks die with it
    ranks.wait()
    done = train(str(plays_file), "-m", tiny_model, "--ckpt-dir", str(tmp_path / "ckpt"),
                 "--trainer", str(jobs))
    assert done.returncode == 69, done.stderr[-2000:]
    assert "resident trainer" in done.stderr.splitlines()[-1] and done.stdout == ""
