"""docs/environments.md: its two complete envs are the files in docs/examples, and `spade validate`
accepts both through the real jail (fresh validation seeds, as a user's run draws them)."""

import re
from pathlib import Path

import orjson
from typer.testing import CliRunner

from sandbox.contract import CHECKS
from spade_cli.app import app

DOCS = Path(__file__).parents[2] / "docs"
EXAMPLES = [DOCS / "examples" / "guess_number.py", DOCS / "examples" / "todo_list.py"]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def test_the_doc_shows_the_example_files_verbatim():
    blocks = PYTHON_BLOCK.findall((DOCS / "environments.md").read_text())
    for path in EXAMPLES:
        assert path.read_text() in blocks, f"{path.name} differs from its block in environments.md"


def test_the_doc_explains_every_check_in_order():
    doc = (DOCS / "environments.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|", doc, re.M)
    assert [row for row in rows if row in CHECKS] == list(CHECKS)


def test_both_examples_pass_validation_in_the_jail(nsjail_ok):
    result = CliRunner().invoke(app, ["validate", *map(str, EXAMPLES)])
    assert result.exit_code == 0, result.stderr
    records = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [(r["kind"], r["class_name"], r["domain"]) for r in records] == [
        ("env", "GuessNumberEnv", "game"), ("env", "TodoListEnv", "tool_use")]
