"""Per-role sampling defaults and switches as the commands declare them (a recipe that sets
nothing samples like the reference), and the design options of the ablations."""

import pytest
from typer.testing import CliRunner

from spade_cli import commands
from spade_cli.app import app

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
