"""The subcommands `spade run` chains, in one place: registered on the `spade` app by app.py and
looked up by the recipe runner, which therefore never imports the app it is part of.

In: a command name (`design`, `model`, ...). Out: its click command (to call it in-process or
read its options) and its Python function (to read its options' types).
Guarantees: importing this module imports no ML framework (each command imports its own).
"""

from __future__ import annotations

from functools import cache
from typing import Callable

import typer


def register(app: typer.Typer) -> None:
    """Every subcommand except `run`, in the order `spade --help` lists them."""
    from spade_cli import (audit, design, eval, hint, memory, model, report, rollout,
                           score_regret, seeds, serve, train_grpo, trainer, validate)

    for module in (model, serve, seeds, design, validate, audit, hint, rollout, score_regret,
                   train_grpo, trainer, eval, memory, report):
        module.register(app)


@cache
def group():
    """The subcommands as one click group: `group().main(args=argv)` runs `spade ARGV...`."""
    commands = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(commands)
    return typer.main.get_command(commands)


@cache
def functions() -> dict[str, Callable]:
    """command name -> the function typer built it from (its signature holds the options)."""
    commands = typer.Typer()
    register(commands)
    return {info.name: info.callback for info in commands.registered_commands}
