"""stages/adapters/common.py: naming an env every way a user can, what a reply becomes, and the
layering rule that put the adapters here (sandbox/, the bottom floor, never imports stages)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stages import seed_library
from stages.adapters.common import env_source, to_action

ROOT = Path(__file__).resolve().parents[3]


def test_an_env_named_every_way_gives_its_source(seed_env):
    record = seed_env("WaterJugsEnv")
    path = seed_library.HERE / "games" / "water_jugs.py"
    assert env_source(str(path)).source == path.read_text()
    by_prefix = env_source(str(seed_library.ENV_SHARD), record.id[:12])
    assert (by_prefix.name, by_prefix.source) == (record.id, record.source)
    assert env_source(record).name == record.id
    assert env_source(record.source).name == "<source>"
    with pytest.raises(ValueError, match="16 env records match id prefix None"):
        env_source(str(seed_library.ENV_SHARD))
    with pytest.raises(ValueError, match="0 env records match"):
        env_source(str(seed_library.ENV_SHARD), "env_nope")


def test_a_reply_becomes_the_action_a_rollout_sends():
    assert to_action("fill A", "game") == "\\boxed{fill A}"
    assert to_action("I pour. \\boxed{pour A B} then \\boxed{fill C}", "game") == \
        "\\boxed{fill C}"
    call = '<tool_call>{"name": "add", "arguments": {"n": 1}}</tool_call>'
    assert to_action(call, "tool_use") == call


def import_time_imports(body: list[ast.stmt]):
    """The modules a module body imports when it is imported: its top-level statements, the
    branches of its ifs and trys, not function bodies nor `if TYPE_CHECKING:` blocks."""
    for node in body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module or ""
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            yield from import_time_imports(node.body + node.orelse)
        elif isinstance(node, (ast.Try, ast.With)):
            yield from import_time_imports(
                node.body + sum((h.body for h in getattr(node, "handlers", [])), [])
                + getattr(node, "orelse", []) + getattr(node, "finalbody", []))


def test_sandbox_loads_without_stages():
    offenders = [f"{path.relative_to(ROOT)}: {name}"
                 for path in sorted((ROOT / "sandbox").rglob("*.py"))
                 for name in import_time_imports(ast.parse(path.read_text()).body)
                 if name == "stages" or name.startswith("stages.")]
    assert offenders == []
