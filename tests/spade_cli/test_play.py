"""`spade play`: a person plays an env through stdin, in the same jail the agent plays in."""

from pathlib import Path

from typer.testing import CliRunner

from sandbox.jail import Worker
from spade_cli.app import app
from stages import seed_library
from stages.records import Env, dumps
from stages.rollout import last_boxed
from stages.shards import read

runner = CliRunner()
GAME = seed_library.HERE / "games" / "number_forge.py"
TOOL_USE = seed_library.HERE / "tool_use" / "room_calendar.py"


def solution(path: Path, seed: int) -> list[str]:
    """The env's own solution for `seed`, asked for inside the jail (env code never runs here)."""
    with Worker() as worker:
        assert worker.call("load", source=path.read_text()).ok
        assert worker.call("reset", seed=seed).ok
        return worker.call("solution").result


def play(*args: str, lines: list[str] = ()):
    return runner.invoke(app, ["play", *args], input="".join(f"{line}\n" for line in lines))


def env_file(tmp_path: Path, step: str, reset_obs: str = "'ready'", max_turns: int = 3) -> str:
    path = tmp_path / "scratch_env.py"
    path.write_text(f"class ScratchEnv:\n    max_turns = {max_turns}\n\n"
                    f"    def reset(self, seed=None):\n        return {reset_obs}, {{}}\n\n"
                    f"    def step(self, action):\n        {step}\n\n"
                    "    def solution(self):\n        return ['x']\n")
    return str(path)


def test_plain_text_game_lines_are_boxed_and_the_solution_wins(nsjail_ok):
    actions = solution(GAME, seed=4)
    typed = [last_boxed(action) for action in actions]  # what a person types: no \boxed{}
    result = play(str(GAME), "--seed", "4", lines=typed)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert out.startswith("NumberForgeEnv: game, seed 4, at most 14 turns;")
    assert f"(sent {actions[0]})" in out and "You win!" in out
    assert out.rstrip().endswith(f"episode over after {len(actions)} turns (terminated): won, "
                                 "episode reward +1.00")


def test_tool_use_lines_go_as_typed_and_the_solution_wins(nsjail_ok):
    actions = solution(TOOL_USE, seed=2)
    result = play(str(TOOL_USE), "--seed", "2", lines=actions)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "\nTools:\n" in out
    assert "  extend_booking(booking_id: string, minutes: integer)  Move the end" in out
    assert "  list_rooms([feature: string], [min_capacity: integer])" in out
    assert "(sent " not in out
    assert out.rstrip().endswith(f"after {len(actions)} turns (terminated): won, episode reward "
                                 "+1.00")


def test_a_record_from_a_shard_by_id_prefix_with_its_hint(tmp_path, nsjail_ok):
    envs = [env for env in read([str(seed_library.ENV_SHARD)]) if isinstance(env, Env)][:2]
    shard = tmp_path / "envs.jsonl"
    shard.write_bytes(dumps(envs[0].model_copy(update={"hint": "Work backwards."}))
                      + dumps(envs[1]))
    result = play(str(shard), "--id", envs[0].id[:10], "--hint", lines=[])
    assert result.exit_code == 0, result.stderr
    assert "\n\nHINT: Work backwards.\n" in result.stdout
    assert "(end of input): not won, episode reward +0.00" in result.stdout
    ambiguous = play(str(shard))
    assert ambiguous.exit_code == 2 and "2 env records match; pick one with --id" in \
        ambiguous.stderr
    no_hint = play(str(shard), "--id", envs[1].id, "--hint")
    assert no_hint.exit_code == 2 and "has no hint" in no_hint.stderr
    assert play(str(shard), "--id", "env_nope").exit_code == 66


def test_the_episode_ends_at_max_turns(tmp_path, nsjail_ok):
    path = env_file(tmp_path, "return 'still here', 0.0, False, False, {}", max_turns=2)
    result = play(path, lines=["a", "", "b", "c", "d"])  # a blank line is not a turn
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("still here") == 2 and "turn 3/" not in result.stdout
    assert "after 2 turns (max_turns (2) reached): not won" in result.stdout


def test_env_text_cannot_drive_the_terminal(tmp_path, nsjail_ok):
    path = env_file(tmp_path, "return '\\x1b[2J\\x1b]0;pwned\\x07', 1.0, True, False, {}",
                    reset_obs="'\\u202etxt.exe'")
    result = play(path, lines=["go"])
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in result.stdout and "\\u202etxt.exe" in result.stdout


def test_an_env_that_breaks_exits_65_with_one_line(tmp_path, nsjail_ok):
    path = env_file(tmp_path, "return 1 / 0")
    result = play(path, lines=["go"])
    assert result.exit_code == 65
    error = result.stderr.strip()
    assert error.startswith(f"spade play: error: {path}: step failed (program_error): "
                            "ZeroDivisionError") and "\n" not in error
    shape = play(env_file(tmp_path, "return 'obs', 'lots', False, False, {}"), lines=["go"])
    assert shape.exit_code == 65 and "reward" in shape.stderr


def test_usage_and_missing_input(tmp_path):
    assert play(str(tmp_path / "absent.py")).exit_code == 66
    assert play(str(GAME), "--hint").exit_code == 2
    assert play("-").exit_code == 2
    assert play(str(GAME), "--sandbox", "docker").exit_code == 2


def typed_line(action: str) -> str:
    """A solution's `<tool_call>{...}</tool_call>` as a person types it: name key=value ..."""
    import json
    import shlex

    if not action.startswith("<tool_call>"):
        return "done" if action == "<answer>done</answer>" else action
    call = json.loads(action[len("<tool_call>"):-len("</tool_call>")])
    words = [call["name"]] + [
        f"{key}={shlex.quote(value if isinstance(value, str) else json.dumps(value))}"
        for key, value in call["arguments"].items()]
    return " ".join(words)


def test_tool_use_name_key_value_lines_and_done_win(nsjail_ok):
    actions = solution(TOOL_USE, seed=2)
    typed = [typed_line(action) for action in actions]
    assert any("=" in line for line in typed) and typed[-1] == "done"
    result = play(str(TOOL_USE), "--seed", "2", lines=typed)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "type a call as: name key=value" in out
    assert 'Call one as: NAME key=value key2="some text"' in out
    assert "(sent <tool_call>" in out and "(sent <answer>done</answer>)" in out
    assert out.rstrip().endswith(f"after {len(actions)} turns (terminated): won, episode reward "
                                 "+1.00")


def test_a_typed_call_that_misfits_the_schema_is_one_line_and_no_turn(nsjail_ok):
    lines = ["extend_booking minutes=30",  # booking_id is required
             "extend_booking booking_id=B1 minutes=30 colour=red",  # no such argument
             "extend_booking booking_id",  # not key=value
             'extend_booking booking_id="B1',  # an unclosed quote
             '{"name": "list_rooms", "arguments": {"min_capacity": 4}}',  # raw JSON: sent
             "list_rooms min_capacity=4 feature='video wall'"]
    result = play(str(TOOL_USE), "--seed", "2", lines=lines)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "(not sent: extend_booking needs booking_id=...)" in out
    assert "(not sent: extend_booking has no argument 'colour' (it takes booking_id, minutes))" \
        in out
    assert "(not sent: extend_booking: 'booking_id' is not key=value)" in out
    assert "(not sent: No closing quotation" in out
    assert ('(sent <tool_call>{"name": "list_rooms", "arguments": {"min_capacity": 4}}'
            '</tool_call>)') in out
    assert ('(sent <tool_call>{"name": "list_rooms", "arguments": {"min_capacity": 4, '
            '"feature": "video wall"}}</tool_call>)') in out
    assert "after 2 turns (end of input)" in out  # only the two sent lines were turns


def test_typed_values_are_json_when_they_parse_and_text_for_string_parameters():
    from spade_cli.play import tool_action

    tools = [{"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "required": ["text"], "properties": {
            "text": {"type": "string"}, "count": {"type": "integer"}, "tags": {}}}}}]
    assert tool_action('note text=007 count=3 tags=\'["a", 1]\'', tools) == (
        '<tool_call>{"name": "note", "arguments": {"text": "007", "count": 3, '
        '"tags": ["a", 1]}}</tool_call>')
    assert tool_action("note text=hi tags=not-json", tools).endswith(
        '"tags": "not-json"}}</tool_call>')
    assert tool_action("something else", tools) == "something else"  # as typed
    assert tool_action("done", tools) == "<answer>done</answer>"
