"""report: one offline HTML page that shows how a `spade run` went, round by round.

In: a run directory (see stages.report.data). Out: `REPORT_DIR/index.html` (inline CSS, no
external requests: it renders offline) and one PNG per chart beside it (or inlined as data URIs
with `embed_images`). Sections, in order: the mean no-hint reward per round (also the header's
headline: the number the loop is meant to raise), overview, win rates and learnable share,
regret and designer reward, validation (which model designed: the run's, or a separate frozen
`[designer]`, also named in the header; acceptance of its designs; the start pool apart),
skill mix, diversity (Vendi score), evaluation, retention (only in a run with retention evals:
the first env set played again by each eval point's checkpoint), training curves (or, when
training had no signal, the words for it; the learning rate among them), completion length and
throughput, examples (the best and worst plays of the newest rounds as transcripts, hints beside
hinted plays, designs with their verdicts and reject reasons; bounded in size), memory. Above the sections, one line per
training statistic past its collapse threshold (tables.ENTROPY_FLOOR, CLIP_FRAC_MAX,
APPROX_KL_MAX) with the step and round it started; regret rows of envs not played in their
round (carried over by score-regret's window) are counted and named.
Guarantees: every section renders with whatever data the run has and says what is missing
(retention, which a run without `retention` never has, is left out instead); a chart is drawn
only where its numbers vary; env-derived text shows literally in charts and page;
the diversity model is optional (without it the section says why and a warning is logged);
nothing is printed (the caller prints one summary line); the page and charts are written
atomically, and under a write root (`spade report` sets the run directory) never through a
symlink out of it (stages/trust.py): a planted `report` link is refused, exit 77.

Modules: data (reading a run), tables (the numbers), diversity (Vendi and the embedder), plots
(matplotlib), page (HTML), sections (each section from its table).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stages.report import sections
from stages.report.data import RunData, load_run
from stages.report.diversity import Embedder
from stages.report.page import render
from stages.report.plots import Charts
from stages.shards import make_dirs, write_atomic

log = logging.getLogger(__name__)


@dataclass
class ReportResult:
    path: Path
    run: RunData
    warnings: list[str]
    numbers: dict[str, Any]
    images: list[Path]  # PNG files written (none with embed_images)
    charts: int
    headline: str  # the mean no-hint reward of the first and last rounds, and the change


def build(run_dir: str | Path, out_dir: str | Path | None = None,
          embedder: Embedder | Literal["auto"] | None = "auto",
          embed_images: bool = False) -> ReportResult:
    """Read the run, draw the charts, write `index.html`; returns its path and the numbers."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    make_dirs(out)
    charts = Charts(out, embed_images, run.all_rounds())
    warnings: list[str] = []
    numbers: dict[str, Any] = {}
    headline_section, headline = sections.no_hint(run, charts, numbers)
    found = [
        headline_section,
        sections.overview(run),
        sections.wins(run, charts, numbers),
        sections.regret(run, charts, numbers),
        sections.validation(run, charts, numbers),
        sections.skills(run, charts, numbers),
        sections.diversity_section(run, charts, numbers, embedder, warnings),
        sections.evaluation(run, charts, numbers),
        sections.retention(run, charts, numbers),
        sections.training(run, charts, numbers),
        sections.throughput(run, charts, numbers),
        sections.examples(run, numbers),
        sections.memory(run),
    ]
    found = [section for section in found if section is not None]  # retention: only with evals
    alerts = sections.alerts(run, numbers)
    for warning in warnings:
        log.warning("%s", warning)
    path = out / "index.html"
    write_atomic(path, [render(run, found, warnings, headline, alerts).encode("utf-8")])
    return ReportResult(path, run, warnings, numbers, charts.written, charts.count,
                        f"{headline[0]} {headline[1]}")
