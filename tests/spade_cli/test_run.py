"""`spade run`: recipes parse strictly, dry-run prints the pipeline, and a killed run resumes
to exactly the records an uninterrupted run writes."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from spade_cli import recipe as recipes
from spade_cli.app import app
from stages import seed_library

RECIPE = Path(__file__).parent.parent / "fixtures" / "run" / "tiny.toml"
runner = CliRunner()


def make_workspace(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(RECIPE, path / "tiny.toml")
    lines = seed_library.ENV_SHARD.read_text().splitlines()
    games = [line for line in lines if '"domain":"game"' in line][:2]
    (path / "pool.jsonl").write_text("\n".join(games) + "\n")
    return path


def records(workspace: Path) -> dict[str, dict]:
    """Every record of the run, by id, with run-specific paths and timings removed."""
    found = {}
    for shard in sorted((workspace / "runs" / "tiny").glob("r*/*/*.jsonl")):
        for line in shard.read_bytes().splitlines():
            data = orjson.loads(line)
            data.pop("meta", None)
            text = orjson.dumps(data).decode().replace(str(workspace), "<ws>")
            found[data["id"]] = orjson.loads(text)
    return found


def fake_model(path: Path) -> Path:
    """A directory that passes the model-folder check (config and tokenizer files)."""
    path.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        (path / name).write_text("{}")
    return path


def spade_run(workspace: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spade_cli", "run", "tiny.toml"],
                            cwd=workspace, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def test_dry_run_prints_every_stage_of_both_rounds(tmp_path, monkeypatch):
    monkeypatch.chdir(make_workspace(tmp_path))
    result = runner.invoke(app, ["run", "tiny.toml", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("spade ")]
    commands = [line.split()[1] for line in lines]
    assert commands == ["model", "design", "validate", "design", "validate", "hint",
                        "rollout", "rollout", "score-regret", "train-grpo",
                        "rollout", "score-regret", "train-grpo"]
    assert "--retry runs/tiny/r00/validate-a0" in lines[3]
    last_train = lines[-1]
    assert "runs/tiny/r01/score-regret" in last_train and "runs/tiny/r00/design-a0" in last_train
    assert 'MODEL="$(ls -d runs/tiny/ckpt/step-*' in result.stdout


def test_validate_and_rollout_stages_can_run_their_jails_on_a_ray_cluster(tmp_path, monkeypatch):
    workspace = make_workspace(tmp_path)
    recipe = (workspace / "tiny.toml").read_text()
    on_ray = 'executor = "ray"\naddress = "10.0.0.1:6379"\n'
    for command in ('command = "validate"\n', 'command = "rollout"\n'):
        recipe = recipe.replace(command, command + on_ray)
    (workspace / "tiny.toml").write_text(recipe)
    monkeypatch.chdir(workspace)
    result = runner.invoke(app, ["run", "tiny.toml", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("spade ")]
    on_cluster = [line.split()[1] for line in lines
                  if "--executor ray --address 10.0.0.1:6379" in line]
    assert on_cluster == [line.split()[1] for line in lines
                          if line.split()[1] in ("validate", "rollout")]
    assert on_cluster.count("validate") == 2 and on_cluster.count("rollout") == 3


@pytest.mark.parametrize("table,message", [
    ('[[stage]]\ncommand = "rollout"\nplys = 3\n', "'plys' is not an option of `spade rollout`"),
    ('[[stage]]\ncommand = "fly"\n', "command must be one of"),
    ('[[stage]]\ncommand = "rollout"\nround = 3\n', "'round' is set by the runner"),
])
def test_bad_recipes_exit_65_naming_the_problem(tmp_path, table, message):
    path = tmp_path / "r.toml"
    path.write_text('schema = "spade.recipe/v1"\nname = "x"\nrun_dir = "r"\nrounds = 1\n' + table)
    result = runner.invoke(app, ["run", str(path), "--dry-run"])
    assert result.exit_code == 65 and message in result.stderr


@pytest.mark.parametrize("table,message", [
    ('[[stage]]\ncommand = "train-grpo"\nlr = "fast"\n',
     'r.toml: stage train-grpo: lr: expected a number, got "fast"'),
    ('[[stage]]\ncommand = "rollout"\nplays = 0\n',
     "r.toml: stage rollout: plays: expected at least 1, got 0"),
    ('[[stage]]\ncommand = "rollout"\nhint = "yes"\n',
     'r.toml: stage rollout: hint: expected true or false, got "yes"'),
    ('[[stage]]\ncommand = "score-regret"\nband = [0.4]\n',
     "r.toml: stage score-regret: band: expected a list of 2 numbers, got [0.4]"),
    ('[[stage]]\ncommand = "design"\nevery = "4"\n',
     'r.toml: stage design: every: expected an integer of at least 1, got "4"'),
    ('[defaults]\nmax-tokens = 1.5\n',
     "r.toml: defaults: max-tokens: expected an integer, got 1.5"),
    ('[defaults]\nmax-tokns = 8\n', "r.toml: defaults: 'max-tokns' is not an option of any"),
    ('[[stage]]\ncommand = "rollout"\nsampling-seed = "never"\n',
     'r.toml: stage rollout: sampling-seed: expected one of request, none, got "never"'),
    ('[defaults]\nsampling-seed = false\n',
     "r.toml: defaults: sampling-seed: expected one of request, none, got false (an option of "
     "`spade design`)"),
])
def test_option_types_are_checked_when_the_recipe_is_read(tmp_path, table, message):
    path = tmp_path / "r.toml"
    path.write_text('schema = "spade.recipe/v1"\nname = "x"\nrun_dir = "r"\nrounds = 1\n' + table)
    result = runner.invoke(app, ["run", str(path), "--dry-run"])
    assert result.exit_code == 65 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_changed_options_of_a_finished_round_are_named_when_it_reruns(tmp_path, monkeypatch):
    """A hint stage with no envs to hint runs no command: the round is only bookkeeping."""
    monkeypatch.chdir(tmp_path)
    fake_model(tmp_path / "model")
    (tmp_path / "runs" / "w" / "memory").mkdir(parents=True)
    (tmp_path / "runs" / "w" / "memory" / "seed.jsonl").write_text("")
    recipe = ('schema = "spade.recipe/v1"\nname = "w"\nrun_dir = "runs/w"\nrounds = 1\n'
              '[model]\ninit = "model"\n[[stage]]\ncommand = "hint"\nmax-tokens = {}\n')
    (tmp_path / "w.toml").write_text(recipe.format(8))
    assert runner.invoke(app, ["run", "w.toml"]).exit_code == 0
    same = runner.invoke(app, ["run", "w.toml"])
    assert same.exit_code == 0 and "warning" not in same.stderr
    (tmp_path / "w.toml").write_text(recipe.format(16))
    changed = runner.invoke(app, ["run", "w.toml"])
    assert changed.exit_code == 0, changed.stderr
    assert ("run w: warning: round 0 was finished with other settings and runs again: "
            "stage hint: max-tokens 8 -> 16") in changed.stderr


def test_dry_run_paths_are_all_relative_in_a_checkout(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    result = runner.invoke(app, ["run", "recipes/quickstart.toml", "--dry-run", "--rounds", "1"])
    assert result.exit_code == 0, result.stderr
    assert "stages/seed_library/starter/envs.jsonl" in result.stdout
    assert not [word for word in result.stdout.split() if word.startswith("/")]


def test_the_runner_does_not_import_the_app_it_is_part_of():
    code = ("import sys; from spade_cli import recipe, run; recipe.option_names('rollout'); "
            "assert 'spade_cli.app' not in sys.modules, 'import cycle'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_recipe_exits_66(tmp_path):
    result = runner.invoke(app, ["run", str(tmp_path / "none.toml")])
    assert result.exit_code == 66


def test_recipe_option_names_match_the_commands():
    assert {"plays", "hint", "max-turns", "concurrency"} <= recipes.option_names("rollout")


@pytest.mark.slow
@pytest.mark.e2e
def test_killed_run_resumes_to_the_same_records(tmp_path, nsjail_ok):
    whole = make_workspace(tmp_path / "whole")
    finished = spade_run(whole)
    assert finished.wait(timeout=900) == 0, finished.stderr.read().decode()[-2000:]
    expected = records(whole)
    assert {r["kind"] for r in expected.values()} >= {"design", "validation", "env", "rollout",
                                                      "regret", "train"}

    killed = make_workspace(tmp_path / "killed")
    rng = random.Random(7)
    for _ in range(3):
        proc = spade_run(killed)
        time.sleep(rng.uniform(2.0, 12.0))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    final = spade_run(killed)
    assert final.wait(timeout=900) == 0, final.stderr.read().decode()[-2000:]
    assert records(killed) == expected
    assert not list((killed / "runs" / "tiny").rglob("*.tmp"))


class Stages:
    """Stands in for the spade command group: records each stage's argv, runs none, and leaves
    the complete manifest a stage leaves in its `-o` folder (a round is done only with them).
    Make it before patching `commands.group`: it keeps the real group's commands (their
    options)."""

    def __init__(self):
        from spade_cli import commands

        self.argvs: list[list[str]] = []
        self.commands = commands.group().commands

    def main(self, args, prog_name, standalone_mode):
        self.argvs.append(list(args))
        out = args[args.index("-o") + 1] if "-o" in args else None
        if out and not out.endswith(".jsonl"):
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "_manifest.json").write_text('{"complete": true}')


def test_a_rerun_removes_the_temp_files_a_killed_run_left(tmp_path, monkeypatch):
    from spade_cli import commands

    monkeypatch.chdir(tmp_path)
    fake_model(tmp_path / "model")
    (tmp_path / "pool.jsonl").write_text("")
    (tmp_path / "w.toml").write_text(
        'schema = "spade.recipe/v1"\nname = "w"\nrun_dir = "runs/w"\nrounds = 1\n'
        'start_pool = "pool.jsonl"\nmemory = false\n[model]\ninit = "model"\n'
        '[[stage]]\ncommand = "rollout"\nhint = false\n')
    hint = tmp_path / "runs" / "w" / "r00" / "hint"
    hint.mkdir(parents=True)
    left = hint / "._manifest.json.92eaeb7bf34844fe.tmp"  # killed between write and rename
    left.write_text("{")
    (hint / "_manifest.json").write_text("{}")
    stages = Stages()
    monkeypatch.setattr(commands, "group", lambda: stages)
    result = runner.invoke(app, ["run", "w.toml"])
    assert result.exit_code == 0, result.stderr
    assert not left.exists() and (hint / "_manifest.json").read_text() == "{}"


def train_inputs(stdout: str) -> dict[int, list[str]]:
    """round -> the shard dirs each train-grpo command of a dry run reads."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("spade train-grpo"):
            words = line.split()
            round_ = int(words[words.index("--round") + 1])
            found[round_] = [w.split("/", 2)[-1] for w in words[words.index("-o") + 2:]]
    return found


def test_designer_samples_train_k_rounds_after_they_were_drawn(tmp_path, monkeypatch):
    """The reference trains the set drawn at t at t + k with its whole window's score; the
    final round flushes the set still open."""
    monkeypatch.chdir(make_workspace(tmp_path))  # k = 2
    result = runner.invoke(app, ["run", "tiny.toml", "--dry-run", "--rounds", "5"])
    assert result.exit_code == 0, result.stderr
    inputs = train_inputs(result.stdout)
    designs = {r: [p for p in paths if "design-a" in p] for r, paths in inputs.items()}
    assert designs[0] == designs[1] == designs[3] == []
    assert designs[2] == ["r00/design-a0", "r00/design-a1"]
    assert "r01/score-regret" in inputs[2] and "r02/score-regret" not in inputs[2]
    assert designs[4] == ["r02/design-a0", "r02/design-a1", "r04/design-a0", "r04/design-a1"]
    assert {"r03/score-regret", "r04/score-regret"} <= set(inputs[4])


def test_an_env_that_stalls_is_not_played_again_for_the_rest_of_its_set(tmp_path, monkeypatch):
    rollouts = [line for line in dry_run(tmp_path, monkeypatch, rounds="3")
                if line.startswith("spade rollout")]
    earlier = [[arg for flag, arg in zip(line.split(), line.split()[1:])
                if flag == "--blacklist-from"] for line in rollouts]
    assert earlier == [[], ["runs/tiny/r00/rollout-hint"],  # round 0: hinted, then no hint
                       ["runs/tiny/r00/rollout-hint", "runs/tiny/r00/rollout"],
                       [], ["runs/tiny/r02/rollout-hint"]]  # round 2 opens a new set (k = 2)


def dry_run(tmp_path, monkeypatch, extra: str = "", rounds: str = "5") -> list[str]:
    workspace = make_workspace(tmp_path)
    monkeypatch.chdir(workspace)
    recipe = workspace / "tiny.toml"
    recipe.write_text(extra + recipe.read_text())
    result = runner.invoke(app, ["run", "tiny.toml", "--dry-run", "--rounds", rounds])
    assert result.exit_code == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith("spade ")]


def test_memory_starts_empty_and_is_written_at_regeneration_steps(tmp_path, monkeypatch):
    lines = dry_run(tmp_path, monkeypatch)
    assert not any(line.startswith("spade memory seed") for line in lines)
    designs = [line for line in lines if line.startswith("spade design")]
    assert "--memory" not in designs[0]
    assert "--memory runs/tiny/memory/r02.jsonl" in designs[-1]  # k = 2: round 4 reads round 2
    writes = [line.split("--memory-out ")[1].split()[0] for line in lines
              if "--memory-out" in line]
    assert writes == ["runs/tiny/memory/r00.jsonl", "runs/tiny/memory/r02.jsonl",
                      "runs/tiny/memory/r04.jsonl"]


def test_memory_can_be_seeded_or_switched_off(tmp_path, monkeypatch):
    seeded = dry_run(tmp_path / "a", monkeypatch, 'memory_seed = "{seeds}"\n')
    assert seeded[1].startswith("spade memory seed ") and seeded[1].endswith(
        "-o runs/tiny/memory/seed.jsonl")
    assert "--memory runs/tiny/memory/seed.jsonl" in next(
        line for line in seeded if line.startswith("spade design"))
    off = dry_run(tmp_path / "b", monkeypatch, "memory = false\n")
    assert not any("--memory" in line for line in off)


def test_an_audit_stage_judges_each_attempt_and_its_rejects_are_retried(tmp_path, monkeypatch):
    workspace = make_workspace(tmp_path)
    monkeypatch.chdir(workspace)
    recipe = workspace / "tiny.toml"
    recipe.write_text(recipe.read_text().replace(
        '[[stage]]\ncommand = "hint"', '[[stage]]\ncommand = "audit"\n\n[[stage]]\ncommand = "hint"'))
    result = runner.invoke(app, ["run", "tiny.toml", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("spade ")]
    assert [line.split()[1] for line in lines][:8] == [
        "model", "design", "validate", "audit", "design", "validate", "audit", "hint"]
    assert "--designs runs/tiny/r00/design-a0" in lines[3]
    assert "--retry runs/tiny/r00/validate-a0 --retry runs/tiny/r00/audit-a0" in lines[4]
    assert lines[7].endswith("runs/tiny/r00/audit-a0 runs/tiny/r00/audit-a1 pool.jsonl")


def test_with_repair_later_attempts_go_on_with_the_rejected_designs(tmp_path, monkeypatch):
    workspace = make_workspace(tmp_path)
    monkeypatch.chdir(workspace)
    recipe = workspace / "tiny.toml"
    recipe.write_text(recipe.read_text().replace("attempts = 2\n", "attempts = 2\nrepair = true\n"))
    result = runner.invoke(app, ["run", "tiny.toml", "--dry-run", "--rounds", "1"])
    assert result.exit_code == 0, result.stderr
    designs = [line for line in result.stdout.splitlines() if line.startswith("spade design")]
    assert "--retry" not in designs[0] and "--repair" not in designs[0]
    assert designs[1].endswith("--retry runs/tiny/r00/validate-a0 --retry "
                               "runs/tiny/r00/design-a0 --repair")


@pytest.mark.parametrize("table,message", [
    ('[[stage]]\ncommand = "validate"\nrepair = true\n',
     "'repair' is a runner key of the design stage only"),
    ('[[stage]]\ncommand = "design"\nrepair = "yes"\n', 'repair: expected true or false, got "yes"'),
])
def test_repair_is_a_design_stage_switch(tmp_path, table, message):
    path = tmp_path / "r.toml"
    path.write_text('schema = "spade.recipe/v1"\nname = "x"\nrun_dir = "r"\nrounds = 1\n' + table)
    result = runner.invoke(app, ["run", str(path), "--dry-run"])
    assert result.exit_code == 65 and message in result.stderr


PAPER_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "qwen3-8b-tool-use.toml"


def test_plan_prints_each_stages_gpus_and_memory_and_exits_0_when_all_fit(monkeypatch):
    monkeypatch.chdir(PAPER_RECIPE.parents[1])
    result = runner.invoke(app, ["run", str(PAPER_RECIPE), "--plan", "--gpus", "8",
                                 "--gpu-memory", "80"])
    assert result.exit_code == 0, result.stderr
    assert "on 8 GPUs of 80.0 GiB" in result.stdout and "Qwen3-8B" in result.stdout
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines()
            if line.startswith("│")}
    assert {"design", "validate", "rollout --no-hint", "train-grpo", "eval"} <= set(rows)
    assert [cell.strip() for cell in rows["train-grpo"].split("│")][2] == "8"
    assert "NO" not in result.stdout


def test_plan_exits_65_naming_the_first_stage_that_does_not_fit(monkeypatch):
    monkeypatch.chdir(PAPER_RECIPE.parents[1])
    result = runner.invoke(app, ["run", str(PAPER_RECIPE), "--plan", "--gpus", "8",
                                 "--gpu-memory", "24"])
    assert result.exit_code == 65
    assert result.stderr.count("\n") == 1
    assert "qwen3-8b-tool-use.toml: stage design leaves " in result.stderr
    fewer = runner.invoke(app, ["run", str(PAPER_RECIPE), "--plan", "--gpus", "4",
                                "--gpu-memory", "80"])
    assert fewer.exit_code == 65 and "needs 8 GPUs, the box has 4" in fewer.stderr
    trainer = runner.invoke(app, ["run", str(PAPER_RECIPE), "--plan", "--gpus", "8",
                                  "--gpu-memory", "40"])
    assert trainer.exit_code == 65
    assert "stage train-grpo needs " in trainer.stderr and "GiB a GPU, the box has 40.0 GiB" \
        in trainer.stderr


def test_plan_checks_host_memory_when_told_the_nodes_and_names_the_stage_short_of_it(
        monkeypatch):
    monkeypatch.chdir(PAPER_RECIPE.parents[1])
    result = runner.invoke(app, ["run", str(PAPER_RECIPE), "--plan", "--gpus", "8",
                                 "--gpu-memory", "80", "--host-memory", "512"])
    assert result.exit_code == 0, result.stderr
    assert "512 GiB of host memory" in result.stdout and "not checked" not in result.stdout
    short = runner.invoke(app, ["run", str(PAPER_RECIPE), "--plan", "--gpus", "8",
                                "--gpu-memory", "80", "--host-memory", "64"])
    assert short.exit_code == 65 and short.stderr.count("\n") == 1
    assert "stage design needs 32 GiB of host memory" not in short.stderr
    assert "stage train-grpo needs " in short.stderr and \
        "GiB of host memory on the node, it has 64 GiB" in short.stderr


def test_plan_defaults_to_this_machines_gpus_else_8_of_80_gib(monkeypatch):
    from spade_cli import run as run_module

    monkeypatch.chdir(PAPER_RECIPE.parents[1])
    monkeypatch.setattr(run_module, "local_gpus", lambda: None)
    result = runner.invoke(app, ["run", str(PAPER_RECIPE), "--plan"])
    assert result.exit_code == 0 and "on 8 GPUs of 80.0 GiB" in result.stdout
    monkeypatch.setattr(run_module, "local_gpus", lambda: [(139 * 2 ** 30, 140 * 2 ** 30)])
    result = runner.invoke(app, ["run", str(PAPER_RECIPE), "--plan"])
    assert result.exit_code == 65 and "on 1 GPU of 140.0 GiB" in result.stdout


def test_a_real_run_checks_the_plan_on_its_own_gpus_before_round_0(tmp_path, monkeypatch):
    from spade_cli import run as run_module

    monkeypatch.chdir(make_workspace(tmp_path))
    # one GPU with 1 GiB free: the tiny model's trainer and the 2 GiB reserve do not fit
    monkeypatch.setattr(run_module, "local_gpus", lambda: [(2 ** 30, 80 * 2 ** 30)])
    result = runner.invoke(app, ["run", "tiny.toml"])
    assert result.exit_code == 65
    assert "tiny.toml: stage " in result.stderr and "1.0 GiB free each" in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran
