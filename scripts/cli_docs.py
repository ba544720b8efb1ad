"""Write docs/cli.md: the `--help` of every `spade` command and subcommand, walked from the click
command tree of the typer app (nested groups such as `spade memory seed` included, hidden
commands left out, in the order `spade --help` lists them).

    python scripts/cli_docs.py              # rewrite docs/cli.md (just cli-docs)
    python scripts/cli_docs.py -o FILE      # write elsewhere (tests/scripts/test_cli_docs.py)

The same text on every machine, whatever the terminal: the help is rendered by typer's own rich
formatter (so the markdown in help texts, its example blocks included, reads as `spade CMD
--help` shows it) onto a console of a fixed width (WIDTH), with no colour and no terminal
codes, and each panel's box drawn as a plain `Options:` heading over an indented table instead.
Set before typer is imported (a terminal's COLUMNS, FORCE_COLOR or TYPER_USE_RICH change
nothing) and again on typer's module globals, which hold what it read. Trailing spaces and
repeated blank lines are cut.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import textwrap
from pathlib import Path

WIDTH = 100
REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "docs" / "cli.md"

for name in ("TYPER_USE_RICH", "FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS", "JUPYTER_COLUMNS"):
    os.environ.pop(name, None)
os.environ.update(TERMINAL_WIDTH=str(WIDTH), COLUMNS=str(WIDTH), _TYPER_FORCE_DISABLE_TERMINAL="1",
                  NO_COLOR="1", TERM="dumb")
sys.path.insert(0, str(REPO))

import typer.core  # noqa: E402
from rich.console import Group  # noqa: E402
from rich.padding import Padding  # noqa: E402
from rich.text import Text  # noqa: E402
from typer import rich_utils  # noqa: E402

from spade_cli.app import app  # noqa: E402

HEADER = """# CLI reference

Every `spade` command's `--help`, as `spade COMMAND --help` prints it. Generated: do not edit by
hand. After changing a command's help, run `python scripts/cli_docs.py` (`just cli-docs`);
`tests/scripts/test_cli_docs.py` fails while this file is stale.
"""


def plain_panel(renderable, *, title: str = "", **_style) -> Group:
    """A help panel without its box: the title as a heading, the table indented under it."""
    return Group(Text(f"{title}:"), Padding(renderable, (0, 0, 1, 2)))


def plain_rendering() -> None:
    if not typer.core.HAS_RICH:
        raise SystemExit("cli_docs: typer renders help without rich here; docs/cli.md is "
                         "written from rich's rendering")
    rich_utils.MAX_WIDTH = WIDTH
    rich_utils.FORCE_TERMINAL = False
    rich_utils.COLOR_SYSTEM = None
    rich_utils.Panel = plain_panel


def walk(command, ctx):
    """(context, command) for a command and, depth first, every visible subcommand. Duck-typed:
    typer 0.2x carries its own copy of click (typer._click), older ones import click."""
    yield ctx, command
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from walk(sub, sub.context_class(sub, info_name=name, parent=ctx))


def help_text(command, ctx) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        plain = command.get_help(ctx)  # rich prints to stdout; click's own formatter returns it
    text = "\n".join(line.rstrip() for line in (out.getvalue() + plain).splitlines())
    return re.sub(r"\n{3,}", "\n\n", textwrap.dedent(text)).strip("\n")


def fenced(text: str) -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading made of words, spaces and hyphens."""
    return heading.lower().replace(" ", "-")


def render() -> str:
    plain_rendering()
    root = typer.main.get_command(app)
    sections = [(ctx.command_path, help_text(command, ctx))
                for ctx, command in walk(root, root.context_class(root, info_name="spade"))]
    contents = "\n".join(f"- [`{path}`](#{anchor(path)})" for path, _ in sections)
    body = "\n\n".join(f"## {path}\n\n{fenced(text)}" for path, text in sections)
    return f"{HEADER}\n{contents}\n\n{body}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"where to write (default: {DEFAULT_OUTPUT.relative_to(REPO)})")
    args = parser.parse_args()
    args.output.write_text(render())


if __name__ == "__main__":
    main()
