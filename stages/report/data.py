"""Reading a run directory into plain per-round tables, folded as the shards are read.

In: a run directory (`recipe.json`, `run.log`, `memory.jsonl` or `memory/`, `ckpt/step-NNNNNN/`,
and per round `r<NN>/<stage-dir>/` shard directories).
Out: a `RunData`: per round, the designs, env records, rejects, regrets, per-env no-hint rewards,
eval roll-ups and train records; the retention evals (`r<NN>/eval-retention/`: the first env
set played again by that round's checkpoint, kept apart from the other evals); the final memory;
the recipe and the tail of `run.log`.
Guarantees: stage directory names are not relied on (every shard under each `r<NN>/` is read,
recursively, and records are grouped by `kind`); a record's round is its own `round` field where
it has one, else the `r<NN>` it was found in (a 0 found outside `r00` is the field's default,
not a claim); records are deduplicated by id per round (the hint and audit stages re-emit env
records); rollouts are folded into per-env no-hint rewards as they are read, so a long run is not
held in memory: of each round they keep only the best and worst no-hint and hinted plays (their
text cut to EXAMPLE_CHARS per field, EXAMPLE_TURNS turns), the first DESIGN_SAMPLES designs'
text, the envs played, and per stage directory the plays and completion tokens (throughput is
those over the directory's `_manifest.json` seconds). An env is *designed* when its parent is a design of this run that no check
rejected, *rejected* when that design was rejected (an audit reject after validation passed),
and otherwise part of the *start pool* (the recipe's `start_pool`, such as the seed library).
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from stages.records import (Design, Env, Eval, Judgement, Memory, Record, Regret, Rollout,
                            Train, Validation)
from stages.shards import MANIFEST, SUFFIXES, InputMissing, read

# RUN/r<NN>/eval-retention: a checkpoint's evals of the first env set (spade_cli/recipe.py)
RETENTION_DIR = "eval-retention"

log = logging.getLogger(__name__)

ROUND_DIR = re.compile(r"^r(\d+)$")
SOURCE_CHARS = 2000
LOG_LINES = 60
# Examples are kept while the shards are read, already cut: a long run's plays are not held.
EXAMPLE_CHARS = 400  # per observation, completion, action, design text (the cut is marked)
EXAMPLE_TURNS = 6  # turns kept per play: the first EXAMPLE_TURNS - 1 and the last
DESIGN_SAMPLES = 24  # designs' text kept per round (the report shows a few of them)

Origin = Literal["designed", "rejected", "pool"]
OVERALL = "overall"  # the category of an eval's roll-up over all its items


@dataclass(frozen=True)
class EnvInfo:
    skill: str
    text: str  # the first SOURCE_CHARS characters of the source
    parents: tuple[str, ...]


@dataclass(frozen=True)
class DesignInfo:
    round: int
    attempt: int
    slot: int = 0
    turn: int = 1  # the designer's turn in its conversation (2 and up: a repair)


def cut(text: str, limit: int = EXAMPLE_CHARS) -> str:
    """`text` of at most `limit` characters plus a mark saying how many were left out."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut: {len(text) - limit} more characters]"


@dataclass(frozen=True)
class ExampleTurn:
    completion: str
    action: str
    observation: str  # what the env answered to the action
    reward: float
    finish_reason: str


@dataclass(frozen=True)
class Example:
    """One play, cut for the page (see EXAMPLE_CHARS, EXAMPLE_TURNS)."""

    id: str
    env_id: str
    hint: bool
    hint_text: str | None  # the hint the play was given (rollout meta, else the env record)
    seed: int
    reward: float
    outcome: str
    turns: tuple[ExampleTurn, ...]
    left_out: int  # turns not kept (between the first ones and the last)

    @classmethod
    def of(cls, record: Rollout) -> Example:
        turns = [ExampleTurn(cut(t.completion), cut(t.action), cut(t.observation),
                             float(t.reward), str(t.finish_reason)) for t in
                 (record.turns if len(record.turns) <= EXAMPLE_TURNS else
                  [*record.turns[:EXAMPLE_TURNS - 1], record.turns[-1]])]
        hint_text = record.meta.get("hint_text") if record.hint else None
        return cls(record.id, record.env_id, record.hint,
                   cut(hint_text) if isinstance(hint_text, str) else None, record.seed,
                   float(record.reward), record.outcome, tuple(turns),
                   max(0, len(record.turns) - EXAMPLE_TURNS))


@dataclass(frozen=True)
class DesignSample:
    id: str
    round: int
    attempt: int
    slot: int
    skill: str
    text: str  # the design's completion, cut


@dataclass
class PlayTally:
    """The plays of one stage directory in one round: for throughput and completion length."""

    plays: int = 0
    completions: int = 0  # turns that record completion_ids
    tokens: int = 0  # their completion tokens
    seconds: float | None = None  # the directory's `_manifest.json` stats.seconds


@dataclass
class RunData:
    """What the report needs from a run."""

    path: Path
    rounds: list[int] = field(default_factory=list)  # the r<NN> directories found
    recipe: dict[str, Any] | None = None
    recipe_text: str | None = None
    log_tail: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    shards: int = 0
    records: int = 0
    counts: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    designs: dict[str, DesignInfo] = field(default_factory=dict)
    envs: dict[int, dict[str, EnvInfo]] = field(default_factory=lambda: defaultdict(dict))
    rejects: dict[int, dict[str, Validation]] = field(default_factory=lambda: defaultdict(dict))
    regrets: dict[int, dict[str, Regret]] = field(default_factory=lambda: defaultdict(dict))
    judgements: dict[int, list[Judgement]] = field(default_factory=lambda: defaultdict(list))
    no_hint: dict[int, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    evals: dict[str, tuple[int, Eval]] = field(default_factory=dict)
    failed_evals: int = 0
    # retention evals per round: env id -> its item, and the overall roll-up (its CI)
    retention: dict[int, dict[str, Eval]] = field(default_factory=lambda: defaultdict(dict))
    retention_overall: dict[int, Eval] = field(default_factory=dict)
    train: dict[str, Train] = field(default_factory=dict)
    memory: dict[str, Memory] = field(default_factory=dict)
    memory_file: str | None = None
    # examples: round -> (hint?, "best"|"worst") -> the play (see Example)
    examples: dict[int, dict[tuple[bool, str], Example]] = field(
        default_factory=lambda: defaultdict(dict))
    design_samples: dict[int, list[DesignSample]] = field(
        default_factory=lambda: defaultdict(list))
    hints: dict[str, str] = field(default_factory=dict)  # env id -> its hint (env records)
    played: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))  # any play
    tallies: dict[int, dict[str, PlayTally]] = field(
        default_factory=lambda: defaultdict(dict))  # round -> stage directory -> plays
    train_rounds: dict[str, int] = field(default_factory=dict)  # train id -> its round dir
    _seen: set[tuple[int, str, str]] = field(default_factory=set)

    def all_rounds(self) -> list[int]:
        return sorted(set(self.rounds) | set(self.counts))

    @property
    def name(self) -> str:
        name = (self.recipe or {}).get("name")
        return str(name) if name else self.path.resolve().name

    def rejected_designs(self) -> dict[str, tuple[int, Validation]]:
        """design key -> (round, its first reject); the key is the design id the reject names,
        or the reject's own id when it names none."""
        out: dict[str, tuple[int, Validation]] = {}
        for number in sorted(self.rejects):
            for reject in self.rejects[number].values():
                out.setdefault(reject.parents[0] if reject.parents else reject.id,
                               (number, reject))
        return out

    def origins(self) -> dict[str, Origin]:
        """env id -> where it came from (see the module docstring)."""
        rejected = self.rejected_designs()
        out: dict[str, Origin] = {}
        for envs in self.envs.values():
            for env_id, env in envs.items():
                mine = [p for p in env.parents if p in self.designs]
                out[env_id] = ("pool" if not mine else
                               "rejected" if any(p in rejected for p in mine) else "designed")
        return out

    def envs_of(self, origin: Origin) -> dict[int, dict[str, EnvInfo]]:
        """Per round (the first round each env appears in), the envs of one origin."""
        origins, seen = self.origins(), set()
        out: dict[int, dict[str, EnvInfo]] = {}
        for number in sorted(self.envs):
            for env_id, env in self.envs[number].items():
                if origins[env_id] == origin and env_id not in seen:
                    seen.add(env_id)
                    out.setdefault(number, {})[env_id] = env
        return out

    def is_design(self, regret: Regret, origins: dict[str, Origin]) -> bool:
        """Whether a regret record scores one of this run's designs (not a start-pool env)."""
        if regret.env_id and regret.env_id in origins:
            return origins[regret.env_id] != "pool"
        return any(p in self.designs for p in [regret.design_id, *regret.parents]) or (
            not regret.env_id and bool(regret.rejected_by))


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
        run.log_tail = log_path.read_text(errors="replace").splitlines()[-LOG_LINES:]
    ckpt = path / "ckpt"
    if ckpt.is_dir():
        run.checkpoints = sorted(p.name for p in ckpt.iterdir() if p.is_dir())
    seconds: dict[Path, float | None] = {}
    for number, directory in round_dirs:
        for shard in shard_files(directory):
            run.shards += 1
            stage = shard.parent
            if stage not in seconds:
                seconds[stage] = manifest_seconds(stage)
            where = str(stage.relative_to(path))
            for record in read([str(shard)]):
                _fold(run, record, number, where, seconds[stage])
    memory_file = final_memory(path)
    if memory_file is not None:
        run.memory_file = str(memory_file.relative_to(path))
        run.shards += 1
        for record in read([str(memory_file)]):
            run.records += 1
            if isinstance(record, Memory):
                run.memory[record.env_id or record.id] = record
    return run


def manifest_seconds(stage: Path) -> float | None:
    """The stage's wall time as its `_manifest.json` records it (stats.seconds), if it does."""
    try:
        manifest = orjson.loads((stage / MANIFEST).read_bytes())
        value = manifest["stats"]["seconds"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)


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


def _keep(run: RunData, number: int, record: Rollout) -> None:
    """Keep the play if it is the round's best or worst so far (ties: the first met stays)."""
    kept, reward = run.examples[number], float(record.reward)
    for which, sign in (("best", 1), ("worst", -1)):
        old = kept.get((record.hint, which))
        if old is None or sign * reward > sign * old.reward:
            kept[(record.hint, which)] = Example.of(record)


def _fold(run: RunData, record: Record, dir_round: int, where: str = "",
          seconds: float | None = None) -> None:
    run.records += 1
    number = round_of(record, dir_round)
    if isinstance(record, Env) and record.hint:  # the hint stage re-emits envs with their hint
        run.hints[record.id] = record.hint
    key = (number, record.kind, record.id)
    if key in run._seen:
        return
    run._seen.add(key)
    run.counts[number][record.kind] += 1
    if isinstance(record, Design):
        run.designs[record.id] = DesignInfo(number, record.attempt, record.slot, record.turn)
        if len(run.design_samples[number]) < DESIGN_SAMPLES:
            run.design_samples[number].append(DesignSample(
                record.id, number, record.attempt, record.slot, record.skill,
                cut(record.completion)))
    elif isinstance(record, Env):
        run.envs[number][record.id] = EnvInfo(record.skill, record.source[:SOURCE_CHARS],
                                              tuple(record.parents))
    elif isinstance(record, Validation):
        run.rejects[number][record.id] = record
    elif isinstance(record, Regret):
        run.regrets[number][record.id] = record
    elif isinstance(record, Judgement):
        run.judgements[number].append(record)
    elif isinstance(record, Rollout):
        if not record.hint:
            run.no_hint[number][record.env_id].append(record.reward)
        run.played[number].add(record.env_id)
        _keep(run, number, record)
        tally = run.tallies[number].setdefault(where, PlayTally(seconds=seconds))
        tally.plays += 1
        for turn in record.turns:
            if turn.completion_ids is not None:
                tally.completions += 1
                tally.tokens += len(turn.completion_ids)
    elif isinstance(record, Eval) and RETENTION_DIR in Path(where).parts:
        if record.task:
            run.retention[number][record.task] = record
        elif record.category == OVERALL:
            run.retention_overall[number] = record
    elif isinstance(record, Eval):
        if record.task:
            return
        if not record.ok:
            run.failed_evals += 1
            return
        run.evals[record.id] = (number, record)
    elif isinstance(record, Train):
        run.train[record.id] = record
        run.train_rounds[record.id] = number
    elif isinstance(record, Memory):
        run.memory[record.env_id or record.id] = record
