"""`spade seeds`: the shipped seed library as design records, ready to pipe into validate."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("seeds")(seeds)


def seeds(
    domain: Annotated[str, typer.Option(help="game, tool_use, or all.")] = "all",
    paths: Annotated[bool, typer.Option("--paths", help="Print the .py file paths instead.")] = False,
    starter: Annotated[bool, typer.Option(
        "--starter", help="The starter tier instead: one-turn games a tiny model learns (the "
                          "quickstart's pool).")] = False,
    examples: Annotated[bool, typer.Option(
        "--examples", help="The examples tier instead: one short env per skill, each whole in a "
                           "memory snippet (a small designer's worked examples).")] = False,
) -> None:
    """Print the seed library: hand-written envs for every skill, as design records.

    Examples:

        spade seeds | spade validate -o runs/seeds/
        spade seeds --paths --domain game
        spade seeds --starter | spade validate --seed 0
        spade seeds --examples | spade validate --seed 0 | spade memory seed -o memory.jsonl
    """
    import sys

    from spade_cli.errors import UsageError, errors_to_exit
    from stages import seed_library
    from stages.shards import encode

    with errors_to_exit("seeds"):
        if domain not in ("game", "tool_use", "all"):
            raise UsageError(f"--domain must be game, tool_use or all, not {domain!r}")
        if starter and examples:
            raise UsageError("--starter and --examples name two tiers: pick one")
        chosen = None if domain == "all" else domain
        files = seed_library.starter_files() if starter else \
            seed_library.example_files(chosen) if examples else seed_library.files(chosen)
        if paths:
            print("\n".join(str(path) for path in files))
            return
        for line in encode(seed_library.designs(files)):
            sys.stdout.buffer.write(line)
