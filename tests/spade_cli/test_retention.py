"""Retention: `retention = N` on the eval stage plays a seeded sample of round 0's envs
(`spade eval --suite envs --sample N`) at every eval point into RUN/r<NN>/eval-retention, as
the dry run prints it; a bad key stops the run naming it."""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from spade_cli.app import app
from stages.records import Env
from stages.shards import read
from tests.spade_cli.test_run import Stages, fake_model, make_workspace

runner = CliRunner()
EVAL = '\n[[stage]]\ncommand = "eval"\nevery = 2\nsuite = "rg-quick"\nretention = 3\n'


def starter_envs(count: int) -> list[Env]:
    from stages import seed_library

    return list(read([str(seed_library.ENV_SHARD)], {"env"}))[:count]


def write_envs(path, envs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(env.to_dict()) + b"\n" for env in envs))
    return str(path)


def test_the_dry_run_evals_round_0s_sample_at_every_eval_point(tmp_path, monkeypatch):
    workspace = make_workspace(tmp_path)
    (workspace / "tiny.toml").write_text((workspace / "tiny.toml").read_text() + EVAL)
    monkeypatch.chdir(workspace)
    result = runner.invoke(app, ["run", "tiny.toml", "--dry-run", "--rounds", "5"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    evals = [line for line in lines if "--suite envs" in line]
    assert evals == [f'spade eval --backend hf --max-tokens 8 --seed 3 --suite envs --sample 3 '
                     f'--round {r} --model "$MODEL" -o runs/tiny/r{r:02d}/eval-retention '
                     f'runs/tiny/r00/hint' for r in (1, 3, 4)]  # every 2 rounds, and the last
    assert sum("--suite rg-quick" in line for line in lines) == 3


@pytest.mark.parametrize("table, message", [
    (EVAL.replace("retention = 3", "retention = 0"),
     "stage eval: retention: expected an integer of at least 1 (envs), got 0"),
    (EVAL.replace("retention = 3", 'retention = "all"'),
     'stage eval: retention: expected an integer of at least 1 (envs), got "all"'),
    ('\n[[stage]]\ncommand = "rollout"\nretention = 3\n',
     "stage rollout: 'retention' is a runner key of the eval stage only"),
    (EVAL.replace("retention", "retension"),
     "'retension' is not an option of `spade eval` (did you mean 'retention'?)"),
])
def test_a_bad_retention_key_exits_65_naming_it(tmp_path, table, message):
    path = tmp_path / "r.toml"
    path.write_text('schema = "spade.recipe/v1"\nname = "x"\nrun_dir = "r"\nrounds = 1\n' + table)
    result = runner.invoke(app, ["run", str(path), "--dry-run"])
    assert result.exit_code == 65 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr


def retention_evals(argvs: list[list[str]]) -> list[list[str]]:
    return [argv for argv in argvs if argv[0] == "eval" and "envs" in argv]


def test_the_runner_evals_a_sample_of_the_start_pool_at_every_eval_point(tmp_path, monkeypatch):
    from spade_cli import commands

    monkeypatch.chdir(tmp_path)
    fake_model(tmp_path / "model")
    write_envs(tmp_path / "pool.jsonl", starter_envs(4))
    (tmp_path / "w.toml").write_text(
        'schema = "spade.recipe/v1"\nname = "w"\nrun_dir = "runs/w"\nrounds = 3\nseed = 2\n'
        'start_pool = "pool.jsonl"\nmemory = false\n[model]\ninit = "model"\n'
        '[[stage]]\ncommand = "rollout"\nhint = false\n'
        '[[stage]]\ncommand = "eval"\nsuite = "rg-quick"\nretention = 3\n')
    stages = Stages()
    monkeypatch.setattr(commands, "group", lambda: stages)
    result = runner.invoke(app, ["run", "w.toml"])
    assert result.exit_code == 0, result.stderr
    retained = retention_evals(stages.argvs)
    assert len(retained) == 3  # no design stage: every round is an eval point of its own set
    for round_, argv in enumerate(retained):
        assert argv[argv.index("--sample") + 1] == "3" and argv[argv.index("--seed") + 1] == "2"
        assert argv[argv.index("-o") + 1:] == [f"runs/w/r{round_:02d}/eval-retention",
                                               "pool.jsonl"]


def test_with_a_hint_stage_the_sample_comes_from_round_0s_hinted_envs(tmp_path, monkeypatch):
    from spade_cli import commands

    monkeypatch.chdir(tmp_path)
    fake_model(tmp_path / "model")
    write_envs(tmp_path / "pool.jsonl", starter_envs(4))
    hinted = starter_envs(3)  # what the hint stage wrote in round 0 (the stage itself is faked)
    write_envs(tmp_path / "runs" / "w" / "r00" / "hint" / "env-00000.jsonl", hinted)
    (tmp_path / "w.toml").write_text(
        'schema = "spade.recipe/v1"\nname = "w"\nrun_dir = "runs/w"\nrounds = 1\n'
        'start_pool = "pool.jsonl"\nmemory = false\n[model]\ninit = "model"\n'
        '[[stage]]\ncommand = "hint"\n[[stage]]\ncommand = "eval"\nsuite = "rg-quick"\n'
        'retention = 5\n')
    stages = Stages()
    monkeypatch.setattr(commands, "group", lambda: stages)
    result = runner.invoke(app, ["run", "w.toml"])
    assert result.exit_code == 0, result.stderr
    [argv] = retention_evals(stages.argvs)
    assert argv[-1] == "runs/w/r00/hint" and argv[argv.index("--sample") + 1] == "5"
