"""`spade memory`: seed and inspect the environment memory the designer learns from."""

from __future__ import annotations

from typing import Annotated

import typer

from spade_cli.options import Inputs, Out

memory_app = typer.Typer(no_args_is_help=True, help="Seed and inspect the environment memory.")


def register(app: typer.Typer) -> None:
    app.add_typer(memory_app, name="memory")


@memory_app.command("seed")
def seed(
    inputs: Annotated[list[str] | None, typer.Argument(
        help="Env shards to seed from (default: the shipped seed library).")] = None,
    out: Out = "-",
) -> None:
    """Memory records for env shards (win 0.5, regret 0: no plays measured yet)."""
    from spade_cli.errors import errors_to_exit
    from spade_cli.summary import summarize
    from stages import memory as store
    from stages import seed_library
    from stages.shards import Stats, emit, read, unique

    with errors_to_exit("memory seed"):
        stats = Stats()
        envs = list(unique(read(inputs or [str(seed_library.ENV_SHARD)], kinds={"env"}), stats))
        stats.read = len(envs)
        emit("memory", out, lambda _journal: iter(store.seed(envs)), {"inputs": inputs}, stats,
             overwrite=True)
        summarize("memory seed", stats, f"{stats.written['memory']} entries")


@memory_app.command("show")
def show(
    inputs: Inputs = ["-"],
    skill: Annotated[str | None, typer.Option(help="Only this skill.")] = None,
) -> None:
    """A table of memory entries: skill, win rate, regret, round, env id."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from spade_cli.errors import errors_to_exit
    from spade_cli.terminal import terminal_safe
    from stages.shards import read

    with errors_to_exit("memory show"):
        entries = [m for m in read(inputs, kinds={"memory"}) if skill in (None, m.skill)]
        table = Table("env", "skill", "win rate", "regret", "round", "first line")
        for m in entries:
            first = next((ln for ln in m.snippet.splitlines()
                          if ln.strip() and not ln.startswith("#")), "")
            # Text cells: env-derived strings are shown as they are, never read as rich markup
            table.add_row(*(Text(terminal_safe(cell)) for cell in (
                m.env_id, m.skill, f"{m.win_rate:.2f}", f"{m.regret:.2f}", str(m.round),
                first[:60])))
        Console().print(table)
        Console(stderr=True).print(f"memory show: {len(entries)} entries")
