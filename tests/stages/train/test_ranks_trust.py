"""The resident trainer's jobs folder is trusted only when it is private, and nothing in it is a
pickle: a folder another user owns or can write to is exit 77 before anything in it is read,
and a planted pickle never runs (issue 33, host-side trust)."""

import os
import pickle
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from spade_cli.app import app
from stages import train
from stages.train import ranks as train_ranks
from stages.records import RecordError, Rollout, Train, Turn, dumps
from stages.shards import OutputError

NOBODY = 65534
PLAY = Rollout(env_id="env_0", seed=1, reward=1.0,
               turns=[Turn(action="a", prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.5])])


class Planted:
    """What another user leaves as an outcome: unpickling it creates `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def planted_jobs(path, mode=0o700, owner=None):
    """A jobs folder that looks served (a ready file naming a live pid) and holds an outcome
    for the next job that runs code if unpickled; returns (folder, the file that code makes)."""
    path.mkdir()
    (path / "ready").write_text(f"1 {os.getpid()}\n")
    marker = path.parent / "pwned"
    (path / "000001.out").write_bytes(pickle.dumps(Planted(marker)))
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return path, marker


def refused(path, mode=0o700, owner=None):
    jobs, marker = planted_jobs(path, mode, owner)
    with pytest.raises(Exception) as caught:
        train_ranks.submit(jobs, [], "model", "ckpt", train.Config(), 0, wait=1)
    assert not marker.exists(), "the planted pickle ran"
    return caught.value


@pytest.mark.parametrize("mode, owner, said", [
    (0o777, None, "its group or everyone can write to it (mode 0777)"),
    (0o770, None, "its group or everyone can write to it (mode 0770)"),
    (0o700, NOBODY, f"owned by uid {NOBODY}"),
])
def test_submit_refuses_a_jobs_folder_that_is_not_private(tmp_path, mode, owner, said):
    if owner is not None and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    error = refused(tmp_path / "jobs", mode, owner)
    assert type(error).__name__ == "Untrusted" and said in str(error)
    assert str(error).startswith(f"{tmp_path / 'jobs'}: ")


def test_a_planted_pickle_in_a_private_folder_is_not_an_outcome(tmp_path):
    error = refused(tmp_path / "jobs")
    assert isinstance(error, RecordError) and "not a job or outcome spade wrote" in str(error)


def test_train_grpo_with_such_a_trainer_is_exit_77_in_one_line(tmp_path, tiny_model):
    jobs, marker = planted_jobs(tmp_path / "jobs", 0o777)
    plays = tmp_path / "plays.jsonl"
    plays.write_bytes(dumps(PLAY))
    result = CliRunner().invoke(app, ["train-grpo", str(plays), "-m", tiny_model, "--ckpt-dir",
                                      str(tmp_path / "ckpt"), "--trainer", str(jobs)])
    assert result.exit_code == 77, result.output
    assert result.stderr.count("\n") == 1 and "spade train-grpo: error: " in result.stderr
    assert not marker.exists() and result.stdout == ""


def test_spade_trainer_refuses_a_folder_others_can_write_before_starting_ranks(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o777)
    os.chmod(jobs, 0o777)
    done = subprocess.run([sys.executable, "-m", "spade_cli", "trainer", str(jobs)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 77, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "mode 0777" in done.stderr
    assert not (jobs / "ready").exists()


def test_a_new_jobs_folder_is_made_private(tmp_path):
    from stages import trust

    made = trust.private_dir(tmp_path / "a" / "jobs")
    assert made.stat().st_mode & 0o777 == 0o700


def test_jobs_and_outcomes_are_json_that_round_trips(tmp_path):
    cfg = train.Config(lr=1e-3, roles=("agent",), betas=(0.8, 0.9))
    spec = tmp_path / "spec.job"
    spec.write_bytes(train_ranks.job([PLAY], "m", "c", cfg, 3))
    assert train_ranks.read_job(spec) == ([PLAY], "m", "c", cfg, 3)
    done = tmp_path / "spec.out"
    step = Train(step=1, stats={"loss": 0.5}, policy="c/step-000001")
    done.write_bytes(train_ranks.outcome(([step], tmp_path / "c", {"samples": 1})))
    assert train_ranks.read_outcome(done) == ([step], tmp_path / "c", {"samples": 1})


@pytest.mark.parametrize("raised, code", [
    (train.Diverged("loss is nan"), 65),
    (RecordError("field 'x': bad", "a.jsonl:3"), 65),
    (OutputError("ckpt: cannot write the output: disk full", 74), 74),
    (KeyError("surprise"), 1),  # an unknown type: a bug, as in one process
])
def test_an_outcome_carries_the_exception_and_its_exit_code(tmp_path, raised, code):
    from spade_cli.errors import exit_code_for

    done = tmp_path / "spec.out"
    done.write_bytes(train_ranks.outcome(raised))
    with pytest.raises(Exception) as caught:
        train_ranks.read_outcome(done)
    assert str(raised) in str(caught.value) and exit_code_for(caught.value) == code
    if code != 1:
        assert type(caught.value) is type(raised)
