"""validate: a tool-use module that restates ToolUseBaseEnv has it dropped (and says so); one whose
own base class changes behaviour stays rejected with a reason."""

import re
from pathlib import Path

import pytest

from sandbox.contract import ContractError, drop_restated_base
from stages import validate as stage
from stages.records import Design, Env, Validation

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "todo_list.py"
RESTATED = '''

class ToolUseBaseEnv:
    """The base class (restated)."""
    max_turns = 20

    def __init__(self, **kwargs):
        pass

    def setup(self):
        raise NotImplementedError("subclasses write setup")

    def step(self, action):
        ...

'''


def with_base(base: str) -> str:
    source = EXAMPLE.read_text()
    head, tail = source.split("\nimport json\n", 1)
    return f"{head}\nimport json\n{base}{tail}"


def test_a_restated_base_is_blanked_keeping_line_numbers():
    source = with_base(RESTATED)
    dropped, changed = drop_restated_base(source)
    assert changed and "class ToolUseBaseEnv" not in dropped
    assert dropped.count("\n") == source.count("\n")
    assert drop_restated_base(EXAMPLE.read_text()) == (EXAMPLE.read_text(), False)


@pytest.mark.parametrize("base, why", [
    (RESTATED.replace("        ...\n", "        return self._reply('won', 1.0, True)\n"),
     "step() has a body of its own"),
    (RESTATED + "    def helper(self):\n        pass\n\n", "helper() is not a method"),
    (RESTATED.replace("max_turns = 20", "max_turns = compute()"), "sets an attribute"),
], ids=["a step of its own", "a helper", "a computed attribute"])
def test_a_base_class_of_its_own_that_changes_behaviour_is_a_structure_reject(base, why):
    with pytest.raises(ContractError, match=re.escape(why)) as caught:
        drop_restated_base(with_base(base))
    assert caught.value.check == "structure" and "remove the class" in caught.value.msg


def test_validate_drops_a_restated_base_and_records_it(nsjail_ok):
    design = Design(domain="tool_use", completion=f"```python\n{with_base(RESTATED)}```")
    record = stage.validate_one(design, stage.Config(seed=0))
    assert isinstance(record, Env), f"{record.check}: {record.error.msg}"
    assert record.meta["validation"]["dropped_base_class"] is True
    assert "class ToolUseBaseEnv" not in record.source
    changed = RESTATED.replace("        ...\n", "        return 'x', 1.0, True, False, {}\n")
    record = stage.validate_one(Design(domain="tool_use",
                                       completion=f"```python\n{with_base(changed)}```"),
                                stage.Config(seed=0))
    assert isinstance(record, Validation) and record.check == "structure"
    assert "ToolUseBaseEnv" in record.error.msg


def test_an_env_written_as_the_base_class_itself_is_renamed_to_subclass_it(nsjail_ok):
    """18 of the coder's 43 tool-use designs: `class ToolUseBaseEnv:` holding the env."""
    source = EXAMPLE.read_text()
    as_base = re.sub(r"class \w+Env\(ToolUseBaseEnv\):", "class ToolUseBaseEnv:", source)
    assert as_base != source
    record = stage.validate_one(Design(domain="tool_use", completion=f"```python\n{as_base}```"),
                                stage.Config(seed=0))
    assert isinstance(record, Env), f"{record.check}: {record.error.msg}"
    assert record.class_name == "ToolUseTaskEnv"
    assert record.meta["validation"]["renamed_base_class"] == "ToolUseTaskEnv"
    assert "class ToolUseTaskEnv(ToolUseBaseEnv):" in record.source
    assert record.source.count("\n") == as_base.count("\n")  # line numbers hold


@pytest.mark.parametrize("change", [
    "class OtherEnv:\n    pass\n\n\n",             # another *Env class: the usual rules
    "class ToolUseBaseEnv:\n    pass\n\n\n",       # two of them
])
def test_a_base_named_env_beside_other_classes_is_not_renamed(change):
    from sandbox.contract import name_env_after_base

    as_base = re.sub(r"class \w+Env\(ToolUseBaseEnv\):", "class ToolUseBaseEnv:",
                     EXAMPLE.read_text())
    assert name_env_after_base(as_base)[1] == "ToolUseTaskEnv"
    head, tail = as_base.split("\nimport json\n", 1)
    crowded = f"{head}\nimport json\n{change}{tail}"
    assert name_env_after_base(crowded) == (crowded, None)
    game = "class ToolUseBaseEnv(object):\n    pass\n"
    assert name_env_after_base(game) == (game, None)  # a base of its own: not an env as written
