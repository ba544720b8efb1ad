"""Confidence intervals, item records and roll-ups shared by every suite.

In: per-item scores (any numbers; each is clipped to [0, 1], NaN or junk counts as 0).
Out: `eval` records: `item` (one per task, `samples` = episodes), `failed_item` (`ok: false`,
score 0, `samples` 0), and `rollups`: one record per category (first-seen order) and one
`overall` (`task` empty) whose `samples` is the number of items, averaging item scores (each
item weighs the same; `details.macro` is the mean of the categories when there are several).
Guarantees: every record carries a 95% confidence interval in ci_low/ci_high: Wilson when the
values it summarises are all 0 or 1, otherwise the normal approximation of the mean (clipped to
[0, 1]; None for a single non-binary value). Items that failed (`ok: false`) are left out of the
roll-ups.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

from stages.records import Eval, Failure

if TYPE_CHECKING:
    from stages.evaluate import Config

OVERALL = "overall"
Z95 = 1.959963984540054


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for `successes` out of `n` Bernoulli trials."""
    if n <= 0:
        raise ValueError("wilson needs n >= 1")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def normal_interval(values: list[float], z: float = Z95) -> tuple[float | None, float | None]:
    """mean +- z * s / sqrt(n) (s: sample standard deviation), clipped to [0, 1]."""
    if len(values) < 2:
        return None, None
    mean = statistics.fmean(values)
    half = z * statistics.stdev(values) / math.sqrt(len(values))
    return max(0.0, mean - half), min(1.0, mean + half)


def interval(values: list[float]) -> tuple[float | None, float | None]:
    """Wilson for 0/1 values, the normal approximation of the mean otherwise."""
    if not values:
        return None, None
    if all(v in (0.0, 1.0) for v in values):
        return wilson(sum(values), len(values))
    return normal_interval(values)


def _unit(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, number)) if math.isfinite(number) else 0.0


def item(cfg: Config, task: str, category: str, scores: list[float], policy: str | None,
         details: dict[str, Any], parents: list[str] | None = None) -> Eval:
    scores = [_unit(s) for s in scores]
    low, high = interval(scores)
    return Eval(suite=cfg.suite_name, task=task, category=category, round=cfg.round,
                score=statistics.fmean(scores) if scores else 0.0, samples=len(scores),
                ci_low=low, ci_high=high, details=details, policy=policy,
                parents=parents or [])


def failed_item(cfg: Config, task: str, category: str, policy: str | None, kind: str,
                msg: str) -> Eval:
    return Eval(suite=cfg.suite_name, task=task, category=category, round=cfg.round, score=0.0,
                samples=0, ok=False, error=Failure(type=kind, msg=msg[:500]), policy=policy)


def rollups(items: list[Eval], suite: str, round: int | None, policy: str | None) -> list[Eval]:
    """One record per category (first-seen order) and one `overall`, over the ok items."""
    good = [r for r in items if r.ok and r.task]
    groups: dict[str, list[Eval]] = {}
    for record in good:
        if record.category:
            groups.setdefault(record.category, []).append(record)
    out = [_rollup(suite, name, members, round, policy) for name, members in groups.items()]
    if good:
        overall = _rollup(suite, OVERALL, good, round, policy)
        if len(groups) > 1:
            macro = statistics.fmean(r.score for r in out)
            overall = overall.model_copy(update={"details": {**overall.details, "macro": macro}})
        out.append(overall)
    return out


def _rollup(suite: str, category: str, members: list[Eval], round: int | None,
            policy: str | None) -> Eval:
    scores = [r.score for r in members]
    low, high = interval(scores)
    return Eval(suite=suite, task="", category=category, round=round,
                score=statistics.fmean(scores), samples=len(members), ci_low=low, ci_high=high,
                details={"episodes": sum(r.samples for r in members)},
                parents=[r.id for r in members], policy=policy)


def _count(stats: Any, reason: str) -> None:
    if stats is not None:
        stats.reasons[reason] += 1
