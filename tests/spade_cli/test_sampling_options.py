"""Per-role sampling defaults and switches as the commands declare them (a recipe that sets
nothing samples like the reference), the per-request seed switch, and the design options of the
ablations."""

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_cli import commands
from spade_cli.app import app
from spade_cli.recipe import GENERATING

runner = CliRunner()
# designer and agent: top-p 0.95, top-k 20 (reference spade/slime/arguments.py:37-46, 69-79);
# hint and audit calls: top-p 0.9, top-k off (spade/slime/model_adapter.py:155; slime default)
ROLE_DEFAULTS = {"design": (0.95, 20), "rollout": (0.95, 20), "hint": (0.9, 0), "audit": (0.9, 0)}


@pytest.mark.parametrize("command,expected", ROLE_DEFAULTS.items())
def test_top_p_top_k_defaults_and_the_thinking_switch(command, expected):
    params = {p.name: p for p in commands.group().commands[command].params}
    assert (params["top_p"].default, params["top_k"].default) == expected
    thinking = params["enable_thinking"]
    assert thinking.default is None  # the chat template's own default
    assert thinking.opts == ["--enable-thinking"]
    assert thinking.secondary_opts == ["--no-enable-thinking"]


@pytest.mark.parametrize("args,message", [
    (["--skill", "juggling"], "--skill 'juggling' is not a game skill"),
    (["--skill", "arithmetic", "--active-skills", "2"], "--active-skills 2 is more than the 1"),
    (["--no-corpus", "--corpus", "docs.jsonl"], "--no-corpus and --corpus exclude each other"),
])
def test_design_refuses_contradictory_ablation_options(args, message):
    result = runner.invoke(app, ["design", "-m", "no-such-model", *args])
    assert result.exit_code == 2 and message in result.stderr


@pytest.mark.parametrize("command", GENERATING)
def test_every_generating_command_seeds_each_request_unless_told_not_to(command):
    sampling_seed = {p.name: p for p in commands.group().commands[command].params}["sampling_seed"]
    assert sampling_seed.opts == ["--sampling-seed"] and sampling_seed.default == "request"
    result = runner.invoke(app, [command, "--sampling-seed", "never", "-m", "m"])
    assert result.exit_code == 2
    assert "'never' is not one of 'request', 'none'" in " ".join(
        result.stderr.replace("│", " ").split())


def test_a_recipe_default_turns_per_request_seeds_off_for_every_generating_stage(tmp_path,
                                                                                monkeypatch):
    recipe = Path(__file__).parent.parent / "fixtures" / "run" / "tiny.toml"
    text = recipe.read_text().replace("[defaults]\n", '[defaults]\nsampling-seed = "none"\n')
    (tmp_path / "tiny.toml").write_text(text)
    shutil.copy(recipe, tmp_path / "unchanged.toml")
    monkeypatch.chdir(tmp_path)
    lines = {}
    for name in ("tiny.toml", "unchanged.toml"):
        result = runner.invoke(app, ["run", name, "--dry-run"])
        assert result.exit_code == 0, result.stderr
        lines[name] = [line for line in result.stdout.splitlines() if line.startswith("spade ")]
    told = {line.split()[1] for line in lines["tiny.toml"] if "--sampling-seed none" in line}
    assert told == {"design", "hint", "rollout"}  # the generating stages this recipe has
    assert not any("--sampling-seed" in line for line in lines["unchanged.toml"])


def test_stop_loops_ends_a_looping_design_early_and_only_when_asked(tiny_model, tmp_path):
    """The tiny random model's greedy design repeats itself: `--stop-loops` ends it there
    (finish_reason repetition, far short of --max-tokens), and the manifest says so; without
    the flag the design runs to --max-tokens and the config has no such key (a run from before
    the option resumes as it was)."""
    import orjson

    designs = {}
    for flag in ("--stop-loops", None):
        out = tmp_path / str(flag)
        result = runner.invoke(app, ["design", "-m", tiny_model, "-b", "1", "--no-corpus",
                                     "--temperature", "0", "--max-tokens", "200", "-o", str(out),
                                     *([flag] if flag else [])])
        assert result.exit_code == 0, result.stderr
        (shard,) = out.glob("design-*.jsonl")
        designs[flag] = orjson.loads(shard.read_bytes().splitlines()[0])
        config = orjson.loads((out / "_manifest.json").read_bytes())["config"]
        assert config.get("stop_loops") is (True if flag else None)
    looped, whole = designs["--stop-loops"], designs[None]
    assert whole["meta"]["finish_reason"] == "length" and len(whole["completion_ids"]) == 200
    assert looped["meta"]["finish_reason"] == "repetition"
    assert looped["completion_ids"] == whole["completion_ids"][:len(looped["completion_ids"])]
    assert len(looped["completion_ids"]) < 200
