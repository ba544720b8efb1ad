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


@pytest.mark.parametrize("name", ["designer_game", "designer_tool_use"])
def test_the_designer_prompts_sketch_a_module_that_parses_and_reads_a_boxed_move(name):
    """What a small designer copies first is the sketch: it must be Python, its class name a
    placeholder, its strings with a backslash raw, and (games) its pattern must read the move
    out of a real reply."""
    import ast
    import re

    sketch = re.search(r"```python\n(.*?)```", prompts.template(name), re.S).group(1)
    tree = ast.parse(sketch)
    assert [type(node).__name__ for node in tree.body][-1] == "ClassDef"
    # a themed name is copied as the theme (12 of 12 coder tool-use designs kept OrderDeskEnv)
    assert tree.body[-1].name.startswith("NameOfYour"), tree.body[-1].name
    assert all(isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef)) for node in tree.body)
    backslashed = [node for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and "\\" in str(node.value)]
    for node in backslashed:
        assert ast.get_source_segment(sketch, node).startswith(("r", "rf")), node.value
    if name == "designer_game":
        pattern = re.search(r'BOXED = re\.compile\((r".*?")\)', sketch).group(1)
        assert re.compile(ast.literal_eval(pattern)).findall(r"I go \boxed{north}") == ["north"]
        action = re.search(r"return \[(.*?) for move in moves\]", sketch).group(1)
        assert eval(action, {"move": "north"}) == r"\boxed{north}"  # one backslash, as typed


@pytest.mark.parametrize("domain", ["game", "tool_use"])
def test_the_design_stage_fills_every_placeholder_of_its_prompt(domain):
    import random

    from stages import design

    cfg = design.Config(domain=domain)
    skill = design.active_skills(domain, 0, 1)[0]
    text, _, _ = design.prompt_for(design.Slot(0, 0, skill), None, [], cfg, random.Random(0))
    assert "{{" not in text and skill in text  # render raises on a value it was not given
