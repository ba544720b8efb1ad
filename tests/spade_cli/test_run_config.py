"""Issue 19, config and commands: recipe typos, run-relative model paths, the run lock, a
quoted --dry-run, model folders checked before loading, stdin on a terminal, .py inputs,
`eval --compare -o` and the one-way imports of stages/evaluate."""

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_cli.app import app

runner = CliRunner()
HEAD = 'schema = "spade.recipe/v1"\nname = "x"\nrun_dir = "r"\nrounds = 1\n'


@pytest.mark.parametrize("text,message", [
    ("sead = 0\n", "r.toml:5: unknown top-level key 'sead' (did you mean 'seed'?)"),
    ("[default]\nmax-tokens = 3\n",
     "r.toml:5: unknown top-level table [default] (did you mean [defaults]?)"),
    ('[model]\ninti = "tiny"\n', "r.toml:6: [model]: unknown key 'inti' (did you mean 'init'?)"),
    ('[model]\npath = "../elsewhere"\n', "r.toml:6: [model] path: '../elsewhere' leaves the run"),
])
@pytest.mark.parametrize("mode", ["--dry-run", "--plan", None])
def test_typos_outside_stage_tables_exit_65_with_path_line(tmp_path, monkeypatch, text,
                                                           message, mode):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.toml").write_text(HEAD + text)
    result = runner.invoke(app, ["run", "r.toml", *([mode] if mode else [])])
    assert result.exit_code == 65, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_missing_init_directory_stops_the_run_before_round_0(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.toml").write_text(HEAD + '[model]\ninit = "./no-such-model"\n')
    result = runner.invoke(app, ["run", "r.toml"])
    assert result.exit_code == 66 and result.stderr.count("\n") == 1
    assert "r.toml: [model] init: ./no-such-model: no such model directory" in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_relative_model_path_lies_in_the_run_so_two_runs_never_share_one(tmp_path,
                                                                           monkeypatch):
    from spade_cli import recipe as recipes

    monkeypatch.chdir(tmp_path)
    models = []
    for run in ("runs/a", "runs/b"):
        (tmp_path / "r.toml").write_text(HEAD.replace('"r"', f'"{run}"')
                                         + '[model]\npath = "runs/quickstart/model"\n')
        models.append(recipes.model_init_commands(recipes.load("r.toml"))[0])
    assert models == ["runs/a/runs/quickstart/model", "runs/b/runs/quickstart/model"]
    (tmp_path / "r.toml").write_text(HEAD + '[model]\npath = "r/model"\n')  # under run_dir
    assert recipes.model_init_commands(recipes.load("r.toml"))[0] == "r/model"
    (tmp_path / "r.toml").write_text(HEAD + '[model]\npath = "m"\n')
    assert recipes.model_init_commands(recipes.load("r.toml"))[0] == "r/m"
    quickstart = recipes.load(str(Path(__file__).parents[2] / "recipes" / "quickstart.toml"))
    assert recipes.model_init_commands(quickstart)[0] == "runs/quickstart/model"


def test_a_second_run_on_the_same_run_dir_exits_73_naming_the_holder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.toml").write_text(HEAD)
    (tmp_path / "r").mkdir()
    with open(tmp_path / "r" / "run.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        result = runner.invoke(app, ["run", "r.toml"])
    assert result.exit_code == 73 and result.stderr.count("\n") == 1
    assert "another spade run (pid 4242) is running in this run directory" in result.stderr
    assert not (tmp_path / "r" / "run.log").exists()
    again = runner.invoke(app, ["run", "r.toml"])  # the lock went with its holder
    assert again.exit_code == 0, again.stderr
    assert (tmp_path / "r" / "run.lock").read_text() == f"{os.getpid()}\n"


def test_run_help_documents_the_busy_exit_code():
    assert "exits 73" in runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).stdout


def test_the_dry_run_script_never_runs_a_recipe_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hostile = "r$(touch pwned-run-dir)'`touch pwned-tick`"
    (tmp_path / "r.toml").write_text(
        HEAD.replace('"r"', json.dumps(hostile)).replace('"x"', '"x\\n touch pwned-name"')
        + '[model]\npath = "$(touch pwned-model)"\n'
        '[[stage]]\ncommand = "rollout"\nplays = 1\n[[stage]]\ncommand = "train-grpo"\n')
    (tmp_path / "pool").mkdir()
    result = runner.invoke(app, ["run", "r.toml", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    script = tmp_path / "pipeline.sh"
    script.write_text(result.stdout)
    stubs = 'spade() { :; }; ls() { echo "$@"; }\n'
    done = subprocess.run(["bash", "-c", stubs + f"source {script}; echo \"$MODEL\""],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("pwned*"))
    assert hostile in done.stdout  # the runner's own $(ls -d ...) still works


def test_a_folder_that_is_not_a_model_is_one_line_naming_the_newest_checkpoint(tmp_path):
    from stages.backends import check_model_files
    from stages.shards import InputMissing

    ckpt = tmp_path / "ckpt"
    for step in ("step-000001", "step-000002"):
        (ckpt / step).mkdir(parents=True)
        (ckpt / step / "config.json").write_text("{}")
    with pytest.raises(InputMissing, match=r"ckpt: not a model directory \(no config.json\): "
                                           r"it holds checkpoints, the newest is .*step-000002"):
        check_model_files(str(ckpt))
    with pytest.raises(InputMissing, match="no tokenizer files beside config.json"):
        check_model_files(str(ckpt / "step-000002"))


def test_train_grpo_on_a_checkpoint_parent_exits_66_in_one_line(tmp_path):
    (tmp_path / "ckpt" / "step-000003").mkdir(parents=True)
    (tmp_path / "ckpt" / "step-000003" / "config.json").write_text("{}")
    result = runner.invoke(app, ["train-grpo", "-m", str(tmp_path / "ckpt"), "-"])
    assert result.exit_code == 66 and result.stderr.count("\n") == 1
    assert "the newest is" in result.stderr and "step-000003" in result.stderr


class Terminal:
    def isatty(self):
        return True


def test_stdin_on_a_terminal_is_a_usage_error_saying_what_is_read(monkeypatch):
    from spade_cli.errors import UsageError
    from spade_cli.inputs import find_inputs

    monkeypatch.setattr(sys, "stdin", Terminal())
    with pytest.raises(UsageError, match="^rollout reads env records on stdin or from files: "
                                         "give a shard or pipe one$"):
        find_inputs("rollout", ["-"], {"env"}, "env records")


def test_a_python_file_given_for_env_records_points_at_validate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_env.py").write_text("class Env: pass\n")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    for command in ("rollout", "hint"):
        result = runner.invoke(app, [command, "my_env.py", "-m", "m"])
        assert result.exit_code == 65, result.output
        assert ("my_env.py is Python source: run `spade validate my_env.py` first to make an "
                "env record") in result.stderr and result.stderr.count("\n") == 1


def test_eval_compare_writes_where_o_points(tmp_path):
    from stages.records import Eval
    from stages.shards import write_atomic

    for name, scores in (("base", [0.0, 1.0, 0.0]), ("trained", [1.0, 1.0, 1.0])):
        (tmp_path / name).mkdir()
        write_atomic(tmp_path / name / "eval-00000.jsonl", [
            Eval(suite="qa", task=f"t{i}", score=s, samples=1).model_dump_json().encode() + b"\n"
            for i, s in enumerate(scores)])
    out = tmp_path / "cmp.json"
    result = runner.invoke(app, ["eval", "--compare", str(tmp_path / "base"),
                                 str(tmp_path / "trained"), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    columns = json.loads(out.read_text())["columns"]
    assert [c["benchmark"] for c in columns] == ["qa", "average"]
    assert columns[0]["difference"] == pytest.approx(2 / 3)
    text = tmp_path / "cmp.txt"
    assert runner.invoke(app, ["eval", "--compare", str(tmp_path / "base"),
                               str(tmp_path / "trained"), "-o", str(text)]).exit_code == 0
    assert "difference" in text.read_text() and "+66.7" in text.read_text()
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_evaluate_helpers_import_no_suite():
    """Imports go one way: the suites import helpers.py, which names none of them."""
    import ast

    source = (Path(__file__).parents[2] / "stages" / "evaluate" / "helpers.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith("stages.evaluate")}
    assert "_RGTasks" not in source and "_BfclEntry" not in source and "_MathVerify" not in source
