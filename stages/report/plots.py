"""The report's charts: matplotlib figures drawn on the Agg canvas, saved as PNG.

In: the per-round tables of stages.report.tables (only the series that carry a signal: the
sections decide what is worth drawing). Out: an `<img>` tag per chart, its PNG written beside
the page or inlined as a data URI.
Guarantees: no pyplot, no global state; every text is drawn literally (no mathtext, no TeX), so
env-derived labels (skills, reject reasons, suite names) show as they are; every line a legend
names is visible (a one-point series gets a marker, a one-round range a bar); no axes is left
empty; a flat-looking series is never stretched into a jagged curve (every y range spans at
least MIN_SPAN of the values' size); a chart matplotlib cannot draw (numbers near the double
range) is a note where it would have been, not the end of the report.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from stages.backends import BackendUnavailable
from stages.records import Eval
from stages.report.diversity import PAPER_VENDI_N, Diversity
from stages.report.tables import (ADVANTAGE_KEY, LEARNABLE, TRAIN_STATS, NoHint,
                                  RetentionPoint, Spread, TrainSeries, WinRates)
from stages.shards import write_atomic

log = logging.getLogger(__name__)

INSTALL_REPORT = "pip install 'spade-selfplay[report]'"
WIN_BINS = 10
SMALL_MULTIPLES = 12  # more rounds than this: one heatmap instead of one histogram per round
MIN_SPAN = 0.01  # a y axis spans at least this share of its largest |value|
SPREAD_PANELS = {"regret": ("regret (scored envs)", "#1f77b4"),
                 "designer_reward": ("designer reward (this run's designs)", "#9467bd")}


class ReportUnavailable(BackendUnavailable):
    """matplotlib is missing (exit 69)."""


def note(text: str) -> str:
    """A paragraph saying what is missing or why nothing is drawn (HTML-escaped)."""
    return f'<p class="missing">{html.escape(text)}</p>'


class Charts:
    """Draws figures with matplotlib's Agg canvas; writes PNG files or keeps data URIs."""

    def __init__(self, out_dir: Path, embed: bool, rounds: Sequence[int] = ()):
        self.rounds = list(rounds)  # every round of the run: the x range of round charts
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            raise ReportUnavailable(f"matplotlib is not installed ({INSTALL_REPORT})") from None
        self.Figure, self.Canvas = Figure, FigureCanvasAgg
        self.out_dir, self.embed = out_dir, embed
        self.written: list[Path] = []
        self.count = 0

    def figure(self, width: float = 10.0, height: float = 3.4):
        fig = self.Figure(figsize=(width, height), dpi=100, layout="constrained")
        self.Canvas(fig)
        return fig

    def save(self, fig, name: str, alt: str) -> str:
        from matplotlib.text import Text

        # Labels hold env-derived text (skills, reject reasons): draw it as it is, never as
        # mathtext or TeX (`$\\undefined$` would stop the report)
        for text in fig.findobj(Text):
            text.set_usetex(False)
            text.set_parse_math(False)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", metadata={"Software": None})
        data = buffer.getvalue()
        self.count += 1
        if self.embed:
            src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        else:
            path = self.out_dir / name
            write_atomic(path, [data])
            self.written.append(path)
            src = name
        return f'<img class="chart" src="{html.escape(src)}" alt="{html.escape(alt)}">'


def _or_note(draw: Callable[..., str]) -> Callable[..., str]:
    """A chart matplotlib cannot draw (numbers it cannot place, such as ±1.7e308, which records
    may hold) becomes a note where it would have been: the rest of the report still renders."""

    @functools.wraps(draw)
    def drawn(*args: Any, **kwargs: Any) -> str:
        try:
            return draw(*args, **kwargs)
        except (ValueError, OverflowError) as exc:
            log.warning("%s: chart not drawn: %s", draw.__name__, exc)
            return note(f"chart not drawn ({type(exc).__name__}: {exc})")

    return drawn


def _plot(ax, xs: Sequence[float], ys: Sequence[float], **style: Any) -> None:
    """A line whose points are always visible: one point alone gets a marker."""
    if len(xs) < 2 and style.get("marker") in (None, "None", ""):
        style["marker"] = "o"
    ax.plot(xs, ys, **style)


def _round_axis(ax, rounds: Sequence[int], span: Sequence[int] = ()) -> None:
    """Round ticks, and the same x range (every round of the run) on every chart."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    every = sorted(set(rounds) | set(span))
    if not every:
        return
    if len(every) <= 15:
        ax.set_xticks(every)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    pad = max(0.7, (3 - (every[-1] - every[0])) / 2)
    ax.set_xlim(every[0] - pad, every[-1] + pad)


def _min_span(ax, values: Sequence[float]) -> None:
    """Widen the y range around the values to at least MIN_SPAN of their size."""
    low, high = min(values), max(values)
    need = MIN_SPAN * max(abs(low), abs(high))
    if high - low < need:
        middle = low / 2 + high / 2
        ax.set_ylim(middle - need / 2, middle + need / 2)


def _integer_y(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


@_or_note
def chart_no_hint(charts: Charts, rewards: dict[int, NoHint]) -> str:
    fig = charts.figure(10, 2.8)
    ax = fig.gca()
    xs = sorted(rewards)
    means = [rewards[n].mean for n in xs]
    _plot(ax, xs, means, marker="o", ms=5, lw=2, color="#1f77b4")
    ax.set_ylim(min(0.0, *means) - 0.05, max(1.0, *means) + 0.05)
    ax.set_ylabel("mean no-hint reward")
    _round_axis(ax, xs, charts.rounds)
    ax.grid(alpha=0.3)
    return charts.save(fig, "no_hint.png", "mean no-hint reward per round")


@_or_note
def chart_wins(charts: Charts, wins: dict[int, WinRates]) -> str:
    rounds = sorted(wins)
    # win is a mean reward: failed or penalised plays (-1) make it negative, which [0, 1] would hide
    low = -1.0 if any(v < 0 for w in wins.values() for v in w.wins) else 0.0
    bins = [low + (1 - low) * i / WIN_BINS for i in range(WIN_BINS + 1)]
    if len(rounds) <= SMALL_MULTIPLES:
        cols = min(len(rounds), 4)
        rows = math.ceil(len(rounds) / cols)
        fig = charts.figure(10, 2.4 * rows + 0.4)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True)
        for ax in axes.flat[len(rounds):]:
            ax.set_visible(False)
        for ax, number in zip(axes.flat, rounds):
            w = wins[number]
            ax.axvspan(*LEARNABLE, color="#2ca02c", alpha=0.08, lw=0)
            ax.hist(w.wins, bins=bins, color="#1f77b4" if w.source == "regret" else "#ff7f0e",
                    edgecolor="white")
            ax.set_title(f"r{number:02d}: {len(w.wins)} envs, learnable {w.learnable_share:.0%}"
                         + ("" if w.source == "regret" else " (rollouts)"), fontsize=9)
            ax.set_xlim(low, 1)
            _integer_y(ax)
        for ax in axes[-1]:
            ax.set_xlabel("win (mean no-hint reward)")
        for ax in axes[:, 0]:
            ax.set_ylabel("envs")
    else:
        import numpy as np

        fig = charts.figure(10, 3.4)
        grid = np.array([np.histogram(wins[n].wins, bins=bins)[0] for n in rounds]).T
        image = fig.gca().imshow(grid, aspect="auto", origin="lower", cmap="viridis",
                                 extent=(rounds[0] - 0.5, rounds[-1] + 0.5, low, 1))
        fig.colorbar(image, label="envs")
        fig.gca().set_ylabel("win (mean no-hint reward)")
        fig.gca().set_xlabel("round")
    return charts.save(fig, "win_rate.png", "win-rate histogram per round")


@_or_note
def chart_line(charts: Charts, name: str, alt: str, points: Sequence[tuple[int, float]],
               ylabel: str, ylim: tuple[float, float]) -> str:
    fig = charts.figure(10, 3.0)
    ax = fig.gca()
    xs, ys = zip(*points)
    _plot(ax, xs, ys, marker="o", ms=4)
    ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel)
    _round_axis(ax, xs, charts.rounds)
    ax.grid(alpha=0.3)
    return charts.save(fig, name, alt)


@_or_note
def chart_spreads(charts: Charts, stats: dict[int, dict[str, Any]], keys: Sequence[str]) -> str:
    """One panel per key (regret, designer_reward): mean ± std, median, min–max per round."""
    fig = charts.figure(10, 3.2)
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    for ax, key in zip(axes, keys):
        title, color = SPREAD_PANELS[key]
        points: list[tuple[int, Spread]] = [(n, s[key]) for n, s in sorted(stats.items())
                                            if s[key] is not None]
        xs = [n for n, _ in points]
        lows, highs = [s.min for _, s in points], [s.max for _, s in points]
        if len(xs) > 1:
            ax.fill_between(xs, lows, highs, color=color, alpha=0.12, lw=0, label="min–max")
        else:
            ax.vlines(xs, lows, highs, color=color, alpha=0.25, lw=8, label="min–max")
        ax.errorbar(xs, [s.mean for _, s in points], yerr=[s.std for _, s in points],
                    color=color, marker="o", ms=4, capsize=3, label="mean ± std")
        _plot(ax, xs, [s.median for _, s in points], color=color, ls=":", marker="_", ms=10,
              label="median")
        ax.axhline(0, color="#888", lw=0.6)
        _min_span(ax, lows + highs + [0.0])
        ax.set_title(title, fontsize=10)
        _round_axis(ax, xs, charts.rounds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return charts.save(fig, "regret.png", "regret and designer reward per round")


@_or_note
def chart_stacked(charts: Charts, name: str, alt: str, counts: dict[int, Counter],
                  ylabel: str, on_top: dict[int, str] | None = None) -> str:
    """Stacked bars per round, one colour per label; `on_top` writes a caption over a bar."""
    fig = charts.figure(10, 3.4)
    ax = fig.gca()
    rounds = sorted(counts)
    labels = sorted({label for c in counts.values() for label in c},
                    key=lambda label: -sum(c[label] for c in counts.values()))
    bottom = [0] * len(rounds)
    for label, color in zip(labels, _palette(len(labels))):
        heights = [counts[n][label] for n in rounds]
        ax.bar(rounds, heights, bottom=bottom, label=label, color=color, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for number, height in zip(rounds, bottom):
        if on_top and number in on_top:
            ax.annotate(on_top[number], (number, height), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(bottom) * 1.15)
    ax.set_ylabel(ylabel)
    _integer_y(ax)
    _round_axis(ax, rounds, charts.rounds)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1))
    return charts.save(fig, name, alt)


@_or_note
def chart_diversity(charts: Charts, values: dict[int, Diversity]) -> str:
    fig = charts.figure(10, 3.0)
    axes = fig.subplots(1, 2)
    xs = sorted(values)
    _plot(axes[0], xs, [values[n].vendi for n in xs], marker="o", ms=4, label="Vendi")
    _plot(axes[0], xs, [values[n].n for n in xs], ls=":", marker="_", ms=10, color="#888",
          label="n (upper bound)")
    axes[0].set_title("Vendi score of the accepted designs", fontsize=10)
    axes[0].legend(fontsize=8)
    _plot(axes[1], xs, [values[n].vendi_n for n in xs], marker="o", ms=4, color="#d62728")
    for (label, value), color in zip(PAPER_VENDI_N.items(), ("#2ca02c", "#d62728")):
        axes[1].axhline(value, color=color, ls="--", lw=0.8, label=f"paper, {label} ({value})")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("Vendi / n", fontsize=10)
    axes[1].legend(fontsize=7)
    for ax in axes:
        _round_axis(ax, xs, charts.rounds)
        ax.grid(alpha=0.3)
    return charts.save(fig, "diversity.png", "Vendi score per round")


@_or_note
def chart_eval(charts: Charts, series: dict[str, list[tuple[int, Eval]]]) -> str:
    fig = charts.figure(10, 3.6)
    ax = fig.gca()
    rounds: set[int] = set()
    for (label, points), color in zip(series.items(), _palette(len(series))):
        xs = [n for n, _ in points]
        ys = [e.score for _, e in points]
        low = [e.score - e.ci_low if e.ci_low is not None else 0.0 for _, e in points]
        high = [e.ci_high - e.score if e.ci_high is not None else 0.0 for _, e in points]
        rounds.update(xs)
        ax.errorbar(xs, ys, yerr=[[max(v, 0.0) for v in low], [max(v, 0.0) for v in high]],
                    marker="o", ms=4, capsize=3, label=label, color=color)
    ax.set_ylabel("score")
    _round_axis(ax, sorted(rounds), charts.rounds)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1))
    return charts.save(fig, "eval.png", "evaluation scores per round")


@_or_note
def chart_retention(charts: Charts, points: Sequence[RetentionPoint]) -> str:
    """The first env set's mean score per eval point, error bars from its interval, each point
    labelled with how many envs it averages."""
    fig = charts.figure(10, 3.4)
    ax = fig.gca()
    xs, ys = [p.round for p in points], [p.score for p in points]
    low = [max(p.score - p.ci_low, 0.0) if p.ci_low is not None else 0.0 for p in points]
    high = [max(p.ci_high - p.score, 0.0) if p.ci_high is not None else 0.0 for p in points]
    ax.errorbar(xs, ys, yerr=[low, high], marker="o", ms=4, capsize=3, color="#1f77b4",
                label="first env set (retention), mean no-hint score")
    for point in points:
        ax.annotate(f"{point.envs} envs", (point.round, point.score), textcoords="offset points",
                    xytext=(0, 7), ha="center", fontsize=7)
    ax.set_ylabel("score")
    _round_axis(ax, xs, charts.rounds)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1))
    return charts.save(fig, "retention.png", "the first env set's score per eval point")


def train_panels(series: TrainSeries, skip: Sequence[str]) -> list[tuple[str, TrainSeries]]:
    """(title, {line label: points}) per panel: the stats in TRAIN_STATS order, then the
    advantage means and stds of every role in one panel; the stats in `skip` left out."""
    panels = [(key, series[key]) for key in TRAIN_STATS if key in series and key not in skip]
    advantage = {}
    for key in sorted(series):
        match = ADVANTAGE_KEY.fullmatch(key)
        if match and match.group(2) in ("mean", "std") and key not in skip:
            for line, points in series[key].items():
                label = f"{match.group(1)} {match.group(2)}"
                advantage[label if line == "all" else f"{label} ({line})"] = points
    if advantage:
        panels.append(("advantage (per role)", advantage))
    return panels


@_or_note
def chart_train(charts: Charts, panels: list[tuple[str, TrainSeries]]) -> str:
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = charts.figure(10, 2.6 * rows + 0.3)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, lines) in zip(axes.flat, panels):
        for label, points in lines.items():
            xs, ys = zip(*points)
            _plot(ax, xs, ys, marker="." if len(xs) < 50 else None,
                  ls="--" if " std" in label else "-", label=label)
        _min_span(ax, [value for points in lines.values() for _, value in points])
        only = next(iter(lines)) if len(lines) == 1 else "all"
        ax.set_title(title if only == "all" else f"{title}: {only}", fontsize=10)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7)
    return charts.save(fig, "train.png", "training curves")


@_or_note
def chart_round_panels(charts: Charts, name: str, alt: str,
                       panels: Sequence[tuple[str, Sequence[tuple[int, float]]]]) -> str:
    """One small panel per (title, [(round, value)]), side by side, the run's rounds on x."""
    fig = charts.figure(10, 2.8)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, points), color in zip(axes, panels, _palette(len(panels))):
        xs, ys = zip(*points)
        _plot(ax, xs, ys, marker="o", ms=4, color=color)
        ax.set_ylim(0, max(ys) * 1.15 if max(ys) > 0 else 1)
        ax.set_title(title, fontsize=10)
        _round_axis(ax, xs, charts.rounds)
        ax.grid(alpha=0.3)
    return charts.save(fig, name, alt)
