"""`spade show`: records as a person reads them, from the small shards in tests/fixtures/show."""

import io
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from spade_cli.app import app
from spade_cli.show import render_rich, view
from stages.shards import read

runner = CliRunner()
FIXTURES = Path(__file__).parents[1] / "fixtures" / "show"
ROLLOUTS = str(FIXTURES / "rollout-00000.jsonl")
WON, HUNG = "ro_9e93d6df5bc2c667", "ro_2cf11772e58e6369"
ENV_SOURCE = Path(__file__).parents[2] / "docs" / "examples" / "guess_number.py"


def show(*args: str, stdin: str | None = None):
    return runner.invoke(app, ["show", *args], input=stdin)


def test_a_rollout_reads_as_a_transcript():
    result = show(ROLLOUTS, "--id", WON)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"=== rollout {WON}  env env_0c74088aaff8c3a4 ==="
    assert "hint: Halve the range that is left with every guess." in lines
    turn_two = lines.index("--- turn 2  reward +0.00")
    assert lines[turn_two + 1] == "action: \\boxed{250}"
    assert lines[turn_two + 2].startswith("observation: 250 is wrong")
    assert "completion: Start in the middle: \\boxed{500}" in lines  # shown where it differs
    assert "completion: \\boxed{250}" not in lines  # not repeated where it is the action
    assert lines[-1].split() == ["outcome", "won:", "terminated", "after", "3", "turns,",
                                 "reward", "+1.00"]


def test_a_failed_rollout_says_what_happened():
    result = show(ROLLOUTS, "--id", HUNG)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-1].split(None, 1) == [
        "outcome", "timeout: step took longer than 10.0 s (reward +0.00)"]


def test_env_text_cannot_drive_the_terminal():
    plain = show(ROLLOUTS).stdout
    assert "\x1b" not in plain and "\x07" not in plain
    assert "\\x1b[31mgo higher\\x1b[0m.\\x1b]0;pwned\\x07 [bold]not markup[/bold]" in plain
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, color_system="standard", width=200)
    assert render_rich((view(record) for record in read([ROLLOUTS])), console) == 2
    styled = buffer.getvalue()
    assert "\x1b]0;pwned" not in styled and "\x07" not in styled  # rich's own styles only
    assert "\\x1b]0;pwned\\x07" in styled
    assert "[bold]not markup[/bold]" in styled  # printed as text, never read as rich markup


def test_an_env_shows_its_verdict_and_numbered_source():
    result = show(str(FIXTURES / "env-00000.jsonl"))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "verdict    accepted: passed every validation check" in out
    assert "class      GuessNumberEnv" in out and "max_turns  12" in out
    source_lines = ENV_SOURCE.read_text().splitlines()
    shown = [line.split(" | ", 1) for line in out.splitlines() if " | " in line]
    assert [int(number) for number, _ in shown] == list(range(1, len(source_lines) + 1))
    assert [text for _, text in shown] == source_lines


def test_a_reject_shows_the_check_and_why():
    result = show(str(FIXTURES / "validation-00000.jsonl"))
    assert result.exit_code == 0, result.stderr
    assert ("verdict             rejected by oracle: replaying solution() for seed 0 did not "
            "win (terminated=False, reward=0.0)") in result.stdout.splitlines()


def test_a_design_shows_its_prompt_and_completion_and_counts_tokens():
    result = show(str(FIXTURES / "design-00000.jsonl"))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "prompt (system): You design text games." in lines
    assert "prompt (user): Write a deduction game." in lines
    assert lines[lines.index("completion:") + 1] == "    Here it is:"
    assert "completion_ids      300 values" in lines
    assert "0, 1, 2" not in result.stdout  # token ids are counted, not dumped


def test_other_kinds_read_as_key_value_lines():
    result = show(str(FIXTURES / "regret-00000.jsonl"))
    assert result.exit_code == 0, result.stderr
    pairs = dict(line.split(None, 1) for line in result.stdout.splitlines()[1:])
    assert pairs["regret"] == "0.75" and pairs["designer_reward"] == "0.6"
    assert pairs["env_id"] == "env_0c74088aaff8c3a4"


def test_id_prefix_limit_and_stdin():
    everything = show(str(FIXTURES))
    headings = [line for line in everything.stdout.splitlines() if line.startswith("=== ")]
    assert [heading.split()[1] for heading in headings] == [
        "design", "env", "regret", "rollout", "rollout", "validation"]
    assert show(str(FIXTURES), "--limit", "2").stdout.count("=== ") == 2
    picked = show(str(FIXTURES), "--id", "ro_")
    assert picked.stdout.count("=== rollout ") == 2 and "=== env" not in picked.stdout
    piped = show("-", "--id", "ro_2c", stdin=Path(ROLLOUTS).read_text())
    assert piped.exit_code == 0 and piped.stdout.count("=== ") == 1


def test_missing_ids_and_files_exit_66():
    result = show(str(FIXTURES), "--id", "nope_")
    assert result.exit_code == 66
    assert result.stderr.strip() == (f"spade show: error: {FIXTURES}: no record with an id "
                                     "starting 'nope_'")
    assert show(str(FIXTURES / "absent.jsonl")).exit_code == 66
