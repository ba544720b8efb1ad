"""`spade registry index|export` and `spade lineage`: exit codes, the --json shape, exports."""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from spade_cli.app import app
from stages.shards import read_shard
from tests.stages.test_registry import make_run

runner = CliRunner()


@pytest.fixture
def indexed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPADE_REGISTRY", raising=False)
    made = make_run(tmp_path)
    result = runner.invoke(app, ["registry", "index", "runs/t"])
    assert result.exit_code == 0, result.stderr
    made["index_stderr"] = result.stderr
    return made


def test_index_writes_the_default_registry_and_a_second_index_is_a_no_op(indexed, tmp_path):
    assert (tmp_path / "spade-registry.db").exists()
    assert "10 shards indexed" in indexed["index_stderr"]
    again = runner.invoke(app, ["registry", "index", "runs/t"])
    assert again.exit_code == 0
    assert "0 shards indexed (no records), 10 unchanged, 0 not complete yet" in again.stderr


def test_lineage_json_shape(indexed):
    result = runner.invoke(app, ["lineage", indexed["env"].id, "--json"])
    assert result.exit_code == 0, result.stderr
    found = orjson.loads(result.stdout)
    assert list(found) == ["kind", "id", "env", "runs", "designs", "validation", "hints",
                           "plays", "regrets", "train_steps", "checkpoints"]
    assert found["kind"] == "env" and found["id"] == indexed["env"].id
    assert set(found["plays"][0]) == {"env_id", "round", "policy", "hint", "plays", "ok",
                                      "mean_reward", "min_reward", "max_reward", "win_rate"}
    ckpt = runner.invoke(app, ["lineage", "step-000002", "--json"])
    assert orjson.loads(ckpt.stdout)["kind"] == "checkpoint"


def test_lineage_text_names_each_section(indexed):
    result = runner.invoke(app, ["lineage", indexed["env"].id])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"env {indexed['env'].id}\n")
    for section in ("designs (1):", "plays (2):", "regrets (1):", "train_steps (2):",
                    "checkpoints (1):"):
        assert section in result.stdout


def test_an_unknown_id_is_one_line_and_exit_2(indexed):
    result = runner.invoke(app, ["lineage", "env_ffffffffffffffff"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "no env, design, checkpoint or eval" in result.stderr


def test_a_missing_registry_is_exit_66(tmp_path):
    result = runner.invoke(app, ["lineage", "env_x", "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 66 and "registry index" in result.stderr


def test_export_writes_an_env_shard_with_a_manifest(indexed, tmp_path):
    result = runner.invoke(app, ["registry", "export", "--min-regret", "0.3", "-o", "out"])
    assert result.exit_code == 0, result.stderr
    [env] = list(read_shard(str(tmp_path / "out" / "env-00000.jsonl")))
    assert env.id == indexed["env"].id and env.meta["registry"]["mean_regret"] == 0.5
    manifest = orjson.loads((tmp_path / "out" / "_manifest.json").read_bytes())
    assert manifest["stage"] == "registry-export" and manifest["complete"]
    skill = runner.invoke(app, ["registry", "export", "--skill", "logic", "--domain", "game"])
    assert len(skill.stdout.splitlines()) == 2  # both programs, on stdout


def test_runs_lists_each_run_with_its_digests(indexed):
    found = orjson.loads(runner.invoke(app, ["registry", "runs", "--json"]).stdout)
    [run] = found
    assert run["run"] == "t" and len(run["validators"]) == len(run["rewards"]) == 1
    text = runner.invoke(app, ["registry", "runs"])
    assert text.exit_code == 0, text.stderr
    header, row = text.stdout.splitlines()
    assert header.split() == ["run", "spade_versions", "validators", "rewards", "changed",
                              "mixed"]
    assert row.split() == ["t", *run["spade_versions"], *run["validators"], *run["rewards"],
                           "-", "-"]


@pytest.mark.parametrize("command", ["registry index", "registry export", "registry runs",
                                     "lineage"])
def test_help_has_an_example(command):
    result = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0 and "Example" in result.stdout
    assert f"spade {command}" in result.stdout


def test_a_forged_env_is_not_indexed_so_lineage_and_export_never_show_it(tmp_path, monkeypatch):
    """An env record carrying one program's id with another program's source: index checks its
    id as every reader does, stops (exit 65) before storing it, and nothing can show or ship
    the forged program under that id."""
    from stages.records import Env, program_hash
    from tests.stages.test_registry import OTHER, SOURCE, env, write

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPADE_REGISTRY", raising=False)
    honest = env(SOURCE, "des_0000000000000000")
    forged = Env(**{**honest.model_dump(), "source": OTHER, "source_hash": program_hash(SOURCE)})
    assert forged.id == honest.id and forged.source == OTHER
    run = tmp_path / "runs" / "f"
    write(run / "r00" / "validate-a0", [forged], stage="validate")
    result = runner.invoke(app, ["registry", "index", "runs/f"])
    assert result.exit_code == 65, result.stderr
    assert result.stderr.count("\n") == 1
    assert f"env-00000.jsonl:1: id does not match its content (expected " in result.stderr
    shown = runner.invoke(app, ["lineage", honest.id])
    assert shown.exit_code == 2 and OTHER not in shown.stdout
    shipped = runner.invoke(app, ["registry", "export"])
    assert shipped.exit_code == 0 and "pick b" not in shipped.stdout and shipped.stdout == ""
