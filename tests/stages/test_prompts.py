"""Prompt files: every placeholder filled, overrides by name, braces left alone."""

import pytest

from stages import prompts


def test_render_fills_placeholders_and_keeps_other_braces():
    text = prompts.render("agent_game", observation="a door")
    assert "a door" in text and "\\boxed{}" in text and "{{" not in text


def test_missing_value_is_an_error():
    with pytest.raises(KeyError, match="observation"):
        prompts.render("agent_game")


def test_override_directory_wins(tmp_path):
    (tmp_path / "agent_game.md").write_text("custom {{observation}}")
    assert prompts.render("agent_game", str(tmp_path), observation="x") == "custom x"


def test_every_shipped_prompt_renders():
    from pathlib import Path

    for path in Path(prompts.__file__).parent.glob("*.md"):
        names = set(prompts.PLACEHOLDER.findall(path.read_text()))
        text = prompts.render(path.stem, **{n: f"<{n}>" for n in names})
        assert "{{" not in text
