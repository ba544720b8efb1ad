"""Paired comparison of two eval runs, in the shape of the paper's tables: base vs trained.

In: the eval records of a base model and of a trained one on the same suites (`read_runs`: an
eval output directory, a shard, or a directory whose subdirectories are eval outputs, such as a
run's round directory `r<NN>/` with its `eval-<suite>/`).
Out: `compare` returns one `Column` per benchmark and a last one, `average`: items paired, base
and trained score, their difference, and a paired 95% confidence interval of the difference.
A benchmark is a suite (its `--name`), except the Reasoning-Gym suites, where each category
(Math, Algorithmic, Cognition, Logic) is one, as they are columns of the paper's table. A score
is the mean of the item scores (each item's share of episodes won), as the roll-ups compute it;
the average is the mean of the benchmark scores, as the paper's Avg column.
Pairing: items match by (suite, task); an item one run lacks, or that failed in either, is left
out and counted in `unpaired`.
Interval: a paired percentile bootstrap over items: resample the items of each benchmark with
replacement, take the mean of the per-item differences (trained - base); for the average,
resample every benchmark so and average their means. BOOTSTRAP_RESAMPLES resamples from
BOOTSTRAP_SEED, so the same inputs always give the same interval.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from stages.records import Eval

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
RG_SUITES = ("rg-hard", "rg-quick")
AVERAGE = "average"


@dataclass(frozen=True)
class Column:
    benchmark: str
    items: int
    base: float
    trained: float
    low: float  # the difference's 95% interval
    high: float
    unpaired: int = 0

    @property
    def difference(self) -> float:
        return self.trained - self.base


def read_runs(path: str) -> list[Eval]:
    """The eval item records under `path` (see the module docstring for the layouts)."""
    from stages.shards import InputMissing, find_shards, read

    if not os.path.exists(path):
        raise InputMissing(f"{path}: no such file or directory")
    inputs = [path]
    if os.path.isdir(path) and not find_shards([path], {"eval"}):
        inputs = sorted(str(p) for p in Path(path).iterdir()
                        if p.is_dir() and not p.name.startswith((".", "_"))
                        and find_shards([str(p)], {"eval"}))
    records = [r for r in read(inputs, kinds={"eval"}) if isinstance(r, Eval)] if inputs else []
    items = [r for r in records if r.task]
    if not items:
        raise InputMissing(f"{path}: no eval item records")
    return items


def benchmark(record: Eval) -> str:
    return f"{record.suite} {record.category}" if record.suite in RG_SUITES else record.suite


def compare(base: Iterable[Eval], trained: Iterable[Eval]) -> list[Column]:
    """One Column per benchmark (first-seen order in `base`), then the average's."""
    import numpy

    def by_key(records: Iterable[Eval]) -> dict[tuple[str, str], Eval]:
        return {(r.suite, r.task): r for r in records if r.task}

    before, after = by_key(base), by_key(trained)
    pairs: dict[str, list[tuple[float, float]]] = {}
    unpaired: dict[str, int] = {}
    for key in list(before) + [k for k in after if k not in before]:
        a, b = before.get(key), after.get(key)
        name = benchmark(a or b)
        pairs.setdefault(name, [])
        if a is None or b is None or not (a.ok and b.ok):
            unpaired[name] = unpaired.get(name, 0) + 1
            continue
        pairs[name].append((a.score, b.score))
    pairs = {name: values for name, values in pairs.items() if values}
    if not pairs:
        raise ValueError("no item is in both runs: are they evaluations of the same suites?")
    rng = numpy.random.default_rng(BOOTSTRAP_SEED)
    columns, resampled = [], []
    for name, values in pairs.items():
        scores = numpy.array(values)
        means = _bootstrap_means(scores[:, 1] - scores[:, 0], rng)
        resampled.append(means)
        low, high = numpy.percentile(means, [2.5, 97.5])
        columns.append(Column(name, len(values), float(scores[:, 0].mean()),
                              float(scores[:, 1].mean()), float(low), float(high),
                              unpaired.get(name, 0)))
    low, high = numpy.percentile(numpy.mean(resampled, axis=0), [2.5, 97.5])
    columns.append(Column(AVERAGE, sum(c.items for c in columns),
                          float(numpy.mean([c.base for c in columns])),
                          float(numpy.mean([c.trained for c in columns])), float(low),
                          float(high), sum(unpaired.values())))
    return columns


def _bootstrap_means(differences, rng):
    """BOOTSTRAP_RESAMPLES means of resampled differences (drawn in chunks to bound memory)."""
    import numpy

    n, chunk, out = len(differences), 1000, []
    for start in range(0, BOOTSTRAP_RESAMPLES, chunk):
        size = min(chunk, BOOTSTRAP_RESAMPLES - start)
        out.append(differences[rng.integers(0, n, size=(size, n))].mean(axis=1))
    return numpy.concatenate(out)
