"""Host-side trust (issue 33): another local user, a hostile recipe or a hostile record.

A recipe cannot set what the runner sets through `args`, play envs unjailed or expose the
server's development endpoints without the `spade run` command line saying so; a run dir of
another user is refused; no write follows a symlink out of the run dir; a round whose output is
missing is never marked done."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_cli.app import app
from stages import serve, trust
from stages.shards import write_atomic
from tests.spade_cli.test_run import Stages, fake_model

runner = CliRunner()
NOBODY = 65534
HEAD = 'schema = "spade.recipe/v1"\nname = "x"\nrun_dir = "r"\nrounds = 1\n'
# one rollout round over a start pool, with a model folder that passes the checks
RUN = ('schema = "spade.recipe/v1"\nname = "w"\nrun_dir = "runs/w"\nrounds = 1\n'
       'start_pool = "pool.jsonl"\nmemory = false\n[model]\ninit = "model"\n'
       '[[stage]]\ncommand = "rollout"\nhint = false\n')


def recipe(tmp_path, text: str) -> str:
    path = tmp_path / "r.toml"
    path.write_text(HEAD + text)
    return str(path)


def one_line(result) -> str:
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


# -- 5. a stage's `args` may not set what the runner sets -----------------------------------

@pytest.mark.parametrize("stage, args, said", [
    ("rollout", '["-o", "/tmp/elsewhere"]', "args: '-o' is set by the runner"),
    ("rollout", '["--out=/tmp/elsewhere"]', "args: '--out' is set by the runner"),
    ("rollout", '["-o/tmp/elsewhere"]', "args: '-o' is set by the runner"),
    ("rollout", '["-m", "other-model"]', "args: '-m' is set by the runner"),
    ("rollout", '["--no-hint"]', "args: '--no-hint' is set by the runner"),
    ("rollout", '["--max-turns", "3", "--round", "7"]', "args: '--round' is set by the runner"),
    ("train-grpo", '["--ckpt-dir", "/tmp/c"]', "args: '--ckpt-dir' is set by the runner"),
    ("validate", '["--allow-all-rejected"]', "args: '--allow-all-rejected' is set by the runner"),
    ("rollout", '["more-envs.jsonl"]', "args: 'more-envs.jsonl' would be an input"),
    ("rollout", '["--", "x"]', "args: '--' would be an input"),
    ("rollout", '["--plys", "3"]', "args: '--plys' is not an option of `spade rollout`"),
])
def test_args_that_set_what_the_runner_sets_are_refused_at_load(tmp_path, stage, args, said):
    path = recipe(tmp_path, f'[[stage]]\ncommand = "{stage}"\nargs = {args}\n')
    result = runner.invoke(app, ["run", path, "--dry-run"])
    assert result.exit_code == 65 and result.stdout == ""
    assert f"{path}: stage {stage}: {said}" in one_line(result)


def test_args_in_server_mode_may_not_set_how_a_stage_reaches_the_server(tmp_path):
    path = recipe(tmp_path, '[serve]\n[[stage]]\ncommand = "rollout"\n'
                            'args = ["--base-url", "http://evil/v1"]\n')
    result = runner.invoke(app, ["run", path, "--dry-run"])
    assert result.exit_code == 65 and "args: '--base-url' is set by the runner" in result.stderr


def test_args_the_runner_does_not_set_pass_through(tmp_path):
    path = recipe(tmp_path, '[[stage]]\ncommand = "rollout"\nargs = ["--plays", "3", '
                            '"--seed=4", "-n", "2"]\n')
    assert runner.invoke(app, ["run", path, "--dry-run"]).exit_code == 0


# -- 6. sandbox = "none" in a recipe needs --unsafe-no-sandbox ------------------------------

@pytest.mark.parametrize("text", [
    '[defaults]\nsandbox = "none"\n[[stage]]\ncommand = "rollout"\n',
    '[[stage]]\ncommand = "validate"\nsandbox = "none"\n',
    '[[stage]]\ncommand = "rollout"\nargs = ["--sandbox", "none"]\n',
    '[[stage]]\ncommand = "eval"\nargs = ["--sandbox=none"]\n',
])
def test_a_recipe_without_a_jail_needs_the_command_lines_consent(tmp_path, text):
    path = recipe(tmp_path, text)
    refused = runner.invoke(app, ["run", path, "--dry-run"])
    assert refused.exit_code == 65 and refused.stdout == ""
    assert "add --unsafe-no-sandbox to `spade run`" in one_line(refused)
    assert f"{path}: stage " in refused.stderr
    allowed = runner.invoke(app, ["run", path, "--dry-run", "--unsafe-no-sandbox"])
    assert allowed.exit_code == 0, allowed.stderr


def test_defaults_without_a_stage_that_plays_need_no_consent(tmp_path):
    path = recipe(tmp_path, '[defaults]\nsandbox = "none"\n[[stage]]\ncommand = "train-grpo"\n')
    assert runner.invoke(app, ["run", path, "--dry-run"]).exit_code == 0


# -- 2. the server's development endpoints stay on loopback ---------------------------------

@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("", False),
    ("10.1.2.3", False), ("example.com", False),
])
def test_loopback_is_127_8_and_ipv6_loopback_and_localhost(host, loopback):
    assert serve.is_loopback(host) is loopback


@pytest.mark.parametrize("args, bound", [
    ([], "127.0.0.1"), (["--host", "0.0.0.0"], "0.0.0.0"), (["--host=10.0.0.1"], "10.0.0.1"),
    (["--hos", "::"], "::"), (["--host", "0.0.0.0", "--host", "127.0.0.1"], "127.0.0.1"),
    (["--dtype", "float32"], "127.0.0.1"),
])
def test_the_bound_address_is_the_last_host_vllm_reads(args, bound):
    assert serve.bound_host("127.0.0.1", args) == bound


@pytest.mark.parametrize("argv", [["--", "--host", "0.0.0.0"], ["--host", "10.1.2.3"]])
def test_serve_off_loopback_is_exit_65_without_allow_remote(tmp_path, argv):
    model = fake_model(tmp_path / "m")
    result = runner.invoke(app, ["serve", "-m", str(model), "--port", "0",
                                 "--python", sys.executable, *argv])
    assert result.exit_code == 65 and result.stdout == ""
    said = one_line(result)
    assert "not a loopback address" in said and "--allow-remote" in said
    assert "/collective_rpc" in said


def test_allow_remote_says_what_the_network_reaches_in_one_line():
    line = serve.exposure("127.0.0.1", ["--host", "0.0.0.0"], allow_remote=True)
    assert line.startswith("serve: warning: listening on 0.0.0.0") and "\n" not in line
    assert "calls any method of the model workers" in line and "from any path" in line
    assert serve.exposure("127.0.0.1", ["--host", "::1"], allow_remote=False) is None


def test_a_recipe_serving_off_loopback_needs_allow_remote(tmp_path):
    path = recipe(tmp_path, '[serve]\nargs = ["--host", "0.0.0.0"]\n'
                            '[[stage]]\ncommand = "rollout"\n')
    refused = runner.invoke(app, ["run", path, "--dry-run"])
    assert refused.exit_code == 65
    assert f"{path}: serve: args: --host 0.0.0.0: not a loopback address" in one_line(refused)
    allowed = runner.invoke(app, ["run", path, "--dry-run", "--allow-remote"])
    assert allowed.exit_code == 0, allowed.stderr
    serve_line = next(line for line in allowed.stdout.splitlines() if "spade serve" in line)
    assert "--allow-remote" in serve_line and "-- --host 0.0.0.0" in serve_line


# -- 4. a run dir of another user, and links out of the run dir ------------------------------

@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A one-round recipe whose stages are faked, run from tmp_path."""
    from spade_cli import commands

    monkeypatch.chdir(tmp_path)
    fake_model(tmp_path / "model")
    (tmp_path / "pool.jsonl").write_text("")
    (tmp_path / "w.toml").write_text(RUN)
    stages = Stages()
    monkeypatch.setattr(commands, "group", lambda: stages)
    monkeypatch.delenv(trust.WRITE_ROOT, raising=False)
    return tmp_path


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")


@pytest.mark.parametrize("folder", ["runs/w", "runs/w/r00"])
def test_a_run_dir_or_a_folder_in_it_of_another_user_is_exit_77(workspace, folder):
    needs_root()
    (workspace / "runs" / "w" / "r00").mkdir(parents=True)
    os.chown(workspace / folder, NOBODY, NOBODY)
    result = runner.invoke(app, ["run", "w.toml"])
    assert result.exit_code == 77
    assert f"{folder}: owned by uid {NOBODY}" in one_line(result)
    assert not (workspace / "runs" / "w" / "run.log").exists()
    assert not (workspace / "runs" / "w" / "recipe.json").exists()


@pytest.mark.parametrize("name", ["run.log", "run.lock"])
def test_the_runner_appends_to_and_locks_no_file_through_a_link(workspace, name):
    victim = workspace / "victim.txt"
    victim.write_text("precious\n")
    (workspace / "runs" / "w").mkdir(parents=True)
    (workspace / "runs" / "w" / name).symlink_to(victim)
    result = runner.invoke(app, ["run", "w.toml"])
    assert result.exit_code == 77
    assert f"runs/w/{name}: a symlink (to {victim})" in one_line(result)
    assert victim.read_text() == "precious\n"


def test_a_stage_folder_linked_out_of_the_run_dir_is_not_written(tmp_path):
    root, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (root / "r00").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "r00" / "rollout").symlink_to(elsewhere)
    (root / "recipe.json").symlink_to(tmp_path / "victim.json")
    with trust.confine(root):
        with pytest.raises(trust.Untrusted, match="leads out of .* through a symlink"):
            write_atomic(root / "r00" / "rollout" / "_manifest.json", [b"{}\n"])
        with pytest.raises(trust.Untrusted, match="a symlink"):
            write_atomic(root / "recipe.json", [b"{}\n"])
    assert not list(elsewhere.iterdir()) and not (tmp_path / "victim.json").exists()
    # a link that stays inside the run dir is no way out, and outside a run nothing changes
    (root / "r00" / "inside").symlink_to(root / "r00")
    with trust.confine(root):
        write_atomic(root / "r00" / "inside" / "x.json", [b"{}\n"])
    write_atomic(root / "r00" / "rollout" / "y.json", [b"{}\n"])
    assert (root / "r00" / "x.json").exists() and (elsewhere / "y.json").exists()


def test_the_write_root_reaches_child_processes(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    code = ("import sys; from stages.shards import write_atomic; "
            "write_atomic(sys.argv[1], [b'x'])")
    with trust.confine(root):
        done = subprocess.run([sys.executable, "-c", code, str(root / "out" / "f")],
                              capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert done.returncode != 0 and "Untrusted" in done.stderr
    assert not (tmp_path / "f").exists()


def test_report_replaces_no_page_through_a_planted_report_link(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    (run / "recipe.json").write_text('{"name": "x", "run_dir": "run"}')
    (other / "index.html").write_text("theirs")
    (run / "report").symlink_to(other)
    result = runner.invoke(app, ["report", str(run), "--no-diversity"])
    assert result.exit_code == 77
    assert f"{run / 'report'}: a symlink (to {other})" in one_line(result)
    assert (other / "index.html").read_text() == "theirs"


# -- 7. a round is done only when every stage it called left its output ----------------------

class Lost(Stages):
    """Stages whose rollout writes its output elsewhere (or not at all)."""

    def main(self, args, prog_name, standalone_mode):
        if args[0] == "rollout":
            self.argvs.append(list(args))
            return
        super().main(args, prog_name, standalone_mode)


@pytest.mark.parametrize("manifest", [None, '{"complete": false}'])
def test_a_round_whose_output_is_missing_is_not_marked_done(workspace, monkeypatch, manifest):
    from spade_cli import commands

    lost = Lost()
    monkeypatch.setattr(commands, "group", lambda: lost)
    if manifest:
        out = workspace / "runs" / "w" / "r00" / "rollout"
        out.mkdir(parents=True)
        (out / "_manifest.json").write_text(manifest)
    result = runner.invoke(app, ["run", "w.toml"])
    assert [argv[0] for argv in lost.argvs] == ["rollout"]
    assert result.exit_code == 73
    assert ("runs/w/r00/rollout: no complete _manifest.json after its stage finished: round 0 "
            "is not marked done") in result.stderr
    assert not (workspace / "runs" / "w" / "r00" / "_round.json").exists()


def test_a_round_whose_outputs_are_complete_is_marked_done(workspace):
    result = runner.invoke(app, ["run", "w.toml"])
    assert result.exit_code == 0, result.stderr
    assert (workspace / "runs" / "w" / "r00" / "_round.json").exists()
