"""The `spade` command: one typer app, one thin module per subcommand.

In: argv. Out: records on stdout or in shard dirs; logs, progress and the one-line summary on
stderr. Guarantees: importing this module imports no ML framework, so `spade --help` and
`spade validate` start instantly; exit codes as in spade_cli/errors.py.
"""

from __future__ import annotations

import logging
import os
import sys

import typer

from spade_cli import __version__

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown",
                  help="SPADE self-play as composable stages over JSONL shards.")
OWN_LOGGERS = {"spade", "spade_cli", "stages", "sandbox"}
# What typer's help shows for a value-taking parameter without a metavar of its own, in place
# of the Python type (`<int>`, `<list[str]>`).
PLAIN_METAVARS = {"<int>": "N", "<int range>": "N", "<float>": "FLOAT", "<float range>": "FLOAT",
                  "<str>": "TEXT", "<list[str]>": "TEXT", "<float,float>": "FLOAT FLOAT"}


def _version(value: bool) -> None:
    if value:
        print(f"spade {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging on stderr."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    setup_logging(level)
    # spade shows its own progress: the libraries' bars (transformers loading weights, tqdm)
    # would only interleave with it. Read when those libraries are imported, so set first.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")


class TerminalSafeFormatter(logging.Formatter):
    """Log lines carry env-derived text (errors, reasons): keep its escape sequences inert."""

    def format(self, record: logging.LogRecord) -> str:
        from spade_cli.terminal import terminal_safe

        return terminal_safe(super().format(record))


def setup_logging(level: int) -> None:
    root = logging.getLogger()
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=Console(stderr=True), show_path=False)
        handler.setFormatter(TerminalSafeFormatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(TerminalSafeFormatter("%(levelname)s %(name)s: %(message)s"))
    if level > logging.DEBUG:  # a library's INFO lines (a model loading) are not for users; -v
        handler.addFilter(lambda record: record.levelno >= logging.WARNING
                          or record.name.split(".")[0] in OWN_LOGGERS)
    root.addHandler(handler)


def plain_help_types() -> None:
    """Help without Python type names: typer (0.2x) shows `<list[str]>` beside an argument that
    already shows its name and `<bool>` beside a flag, which takes no value; other parameters
    without a metavar get N, FLOAT or TEXT. Older typers (click's metavars) are left alone."""
    from typer import core

    if not hasattr(core.TyperArgument, "display_type_rich"):
        return
    shown = core.TyperOption.display_type_rich

    def option_type(self, ctx):
        if self.metavar is None and self.is_flag:
            return None
        text = shown(self, ctx)
        return PLAIN_METAVARS.get(text, text) if self.metavar is None else text

    core.TyperArgument.display_type_rich = lambda self, ctx: None
    core.TyperOption.display_type_rich = option_type


def _register() -> None:
    from spade_cli import commands, play, registry, run, show

    run.register(app)
    registry.register(app)  # `spade registry index|export`, `spade lineage`
    commands.register(app)
    for reader in (play, show):  # for people, not recipe stages: commands.py leaves them out
        reader.register(app)
    plain_help_types()


_register()


def main() -> None:
    app()
