"""docs/cli.md is what scripts/cli_docs.py writes from the CLI as it is now: a command, option or
help text changed without regenerating it fails here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


def generate(output: Path, **env: str) -> str:
    subprocess.run([sys.executable, str(REPO / "scripts" / "cli_docs.py"), "-o", str(output)],
                   cwd=REPO, env={**os.environ, **env}, check=True, timeout=120)
    return output.read_text()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> str:
    return generate(tmp_path_factory.mktemp("cli-docs") / "cli.md")


def test_cli_docs_are_current(fresh):
    assert fresh == (REPO / "docs" / "cli.md").read_text(), \
        "docs/cli.md is stale: run python scripts/cli_docs.py"


def test_the_terminal_changes_nothing(fresh, tmp_path):
    """A narrow terminal that asks for colour, or typer told to skip rich, writes the same file."""
    odd = generate(tmp_path / "odd.md", COLUMNS="40", TERMINAL_WIDTH="50", FORCE_COLOR="1",
                   TERM="xterm-256color", TYPER_USE_RICH="0")
    assert odd == fresh
    assert "\x1b" not in fresh and "╭" not in fresh


def test_every_command_has_its_section(fresh):
    text = fresh
    for path in ("spade", "spade run", "spade train-grpo", "spade memory seed",
                 "spade registry export", "spade model tiny"):
        assert f"\n## {path}\n" in text, path
    assert "Usage: spade memory seed " in text
