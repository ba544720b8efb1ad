"""The `spade` command: one typer app, one thin module per subcommand.

In: argv. Out: records on stdout or in shard dirs; logs, progress and the one-line summary on
stderr. Guarantees: importing this module imports no ML framework, so `spade --help` and
`spade validate` start instantly; exit codes as in spade_cli/errors.py.
"""

from __future__ import annotations

import logging
import sys

import typer

from spade_cli import __version__

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="SPADE self-play as composable stages over JSONL shards.")


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


def setup_logging(level: int) -> None:
    root = logging.getLogger()
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=Console(stderr=True), show_path=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)


def _register() -> None:
    from spade_cli import (design, eval, hint, memory, model, report, rollout, run, score_regret,
                           seeds, train_grpo, validate)

    for module in (run, model, seeds, design, validate, hint, rollout, score_regret, train_grpo,
                   eval, memory, report):
        module.register(app)


_register()


def main() -> None:
    app()
