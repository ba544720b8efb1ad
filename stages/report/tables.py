"""The report's numbers: per-round tables computed from a `RunData`, no drawing, no HTML.

In: a `RunData` (stages.report.data). Out: plain dataclasses and dicts keyed by round: no-hint
reward, win rates and learnable share, regret and designer reward, acceptance of the model's
designs (per round, per attempt, overall, reject reasons by check), skill mix, eval series, train
series, and what the training records say about the learning signal.
Guarantees: the start pool is never counted as designs (acceptance, designer reward and skill mix
are over this run's designs; the pool's skills are a separate table); averages take any finite
doubles (a sum that overflows is averaged term by term); `flat` is the one test of "this series
carries no signal" that every chart and note uses.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from statistics import fmean, median, pstdev
from typing import Iterable, Literal, Sequence

from stages.records import Eval
from stages.report.data import RunData

LEARNABLE = (0.2, 0.8)
TRAIN_STATS = ("loss", "entropy", "grad_norm", "clip_frac", "approx_kl", "kl_ref", "tis_weight")
ADVANTAGE_KEY = re.compile(r"(.+)_adv_(mean|std|min|max)")
# A series is flat when its spread is within float round-off of a policy that did not move
# (approx_kl ~1e-11 between identical weights) or a thousandth of its size (sampling noise).
NOISE_FLOOR = 1e-9
RELATIVE_SPREAD = 1e-3
ROLE_SAME_REWARD = {"agent": "all plays of every env got the same reward",
                    "designer": "all designs got the same designer reward"}


def mean(values: Iterable[float]) -> float:
    """fmean that also takes finite numbers whose sum is not (a record may hold any double)."""
    values = list(values)
    try:
        return fmean(values)
    except OverflowError:
        return math.fsum(value / len(values) for value in values)


def flat(values: Sequence[float]) -> bool:
    """No signal: every value the same, up to round-off and sampling noise."""
    low, high = min(values), max(values)
    spread = high / 2 - low / 2  # halves: the spread of ±1.7e308 is still a finite number
    return spread <= max(NOISE_FLOOR, RELATIVE_SPREAD * max(abs(low), abs(high))) / 2


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
        return cls(len(values), mean(values), pstdev(values), min(values), median(values),
                   max(values))


@dataclass(frozen=True)
class NoHint:
    envs: int
    pool: int  # of them from the start pool
    plays: int
    mean: float  # over plays
    won: float  # share of plays with reward > 0


def no_hint_rewards(run: RunData) -> dict[int, NoHint]:
    """Per round: the agent's mean reward over its no-hint plays (the win rate the loop raises)."""
    origins = run.origins()
    out = {}
    for number in run.all_rounds():
        plays = {env: rewards for env, rewards in run.no_hint.get(number, {}).items() if rewards}
        rewards = [reward for values in plays.values() for reward in values]
        if rewards:
            pool = sum(origins.get(env) == "pool" for env in plays)
            out[number] = NoHint(len(plays), pool, len(rewards), mean(rewards),
                                 mean(reward > 0 for reward in rewards))
    return out


@dataclass(frozen=True)
class WinRates:
    source: Literal["regret", "rollout"]
    wins: list[float]
    pool: int  # envs from the start pool among them
    learnable_share: float


def learnable_share(wins: Sequence[float], band: tuple[float, float] = LEARNABLE) -> float:
    return mean(band[0] <= w <= band[1] for w in wins)


def win_rates(run: RunData) -> dict[int, WinRates]:
    """Per round: the regret records' `win` of scored envs, else no-hint success per env."""
    origins = run.origins()
    out = {}
    for number in run.all_rounds():
        scored = {r.env_id: r.win for r in run.regrets.get(number, {}).values()
                  if r.env_id and not r.broken}
        source: Literal["regret", "rollout"] = "regret"
        if not scored:
            source = "rollout"
            scored = {env: mean(reward > 0 for reward in rewards)
                      for env, rewards in run.no_hint.get(number, {}).items() if rewards}
        if scored:
            wins = list(scored.values())
            pool = sum(origins.get(env) == "pool" for env in scored)
            out[number] = WinRates(source, wins, pool, learnable_share(wins))
    return out


def regret_stats(run: RunData) -> dict[int, dict[str, Spread | None | int]]:
    """Per round: regret of scored envs (start pool included: it measures the agent); designer
    reward of this run's scored designs, rejected ones included (the start pool is no design);
    how many scored envs had a hint that gives the answer away, and how many a no-hint win
    within noise of their chance level."""
    origins = run.origins()
    out = {}
    for number in run.all_rounds():
        records = list(run.regrets.get(number, {}).values())
        if not records:
            continue
        valid = [r for r in records if r.env_id and not r.broken]
        designs = [r for r in records if run.is_design(r, origins)]
        out[number] = {"regret": Spread.of([r.regret for r in valid]),
                       "designer_reward": Spread.of([r.designer_reward for r in designs]),
                       "invalid": len(records) - len(valid),
                       "hint_leaks": sum(r.hint_leaks for r in records if r.env_id),
                       "at_chance": sum(r.at_chance for r in valid),
                       "envs": sum(1 for r in records if r.env_id)}
    return out


@dataclass(frozen=True)
class Acceptance:
    designs: int
    accepted: int
    reasons: Counter  # check -> rejected designs

    @property
    def rejected(self) -> int:
        return sum(self.reasons.values())

    @property
    def unjudged(self) -> int:
        return self.designs - self.accepted - self.rejected

    @property
    def rate(self) -> float | None:
        judged = self.accepted + self.rejected
        return self.accepted / judged if judged else None


@dataclass(frozen=True)
class Verdict:
    round: int
    attempt: int
    check: str | None  # the check that rejected the design; None: accepted or not judged
    accepted: bool


def verdicts(run: RunData) -> list[Verdict]:
    """One per design of this run (and per reject whose design record is not in the run)."""
    rejected = run.rejected_designs()
    origins = run.origins()
    accepted = {parent for envs in run.envs.values() for env_id, env in envs.items()
                if origins[env_id] == "designed" for parent in env.parents}
    out = []
    for design_id, design in run.designs.items():
        check = rejected[design_id][1].check if design_id in rejected else None
        out.append(Verdict(design.round, design.attempt, check, design_id in accepted))
    out += [Verdict(number, reject.attempt, reject.check, False)
            for key, (number, reject) in rejected.items() if key not in run.designs]
    return out


def acceptance_of(found: Iterable[Verdict]) -> Acceptance:
    found = list(found)
    return Acceptance(len(found), sum(v.accepted for v in found),
                      Counter(v.check for v in found if v.check is not None))


def acceptance(run: RunData) -> dict[int, dict[int | None, Acceptance]]:
    """round -> attempt -> acceptance, with attempt None for the whole round."""
    by_round: dict[int, list[Verdict]] = defaultdict(list)
    for verdict in verdicts(run):
        by_round[verdict.round].append(verdict)
    out: dict[int, dict[int | None, Acceptance]] = {}
    for number, found in sorted(by_round.items()):
        out[number] = {None: acceptance_of(found)}
        for attempt in sorted({v.attempt for v in found}):
            out[number][attempt] = acceptance_of(v for v in found if v.attempt == attempt)
    return out


def skill_mix(run: RunData) -> dict[int, Counter]:
    """Per round: the skills of the accepted designs."""
    return {number: Counter(env.skill or "(none)" for env in envs.values())
            for number, envs in run.envs_of("designed").items()}


def pool_skills(run: RunData) -> Counter:
    return Counter(env.skill or "(none)" for envs in run.envs_of("pool").values()
                   for env in envs.values())


def eval_series(run: RunData) -> dict[str, list[tuple[int, Eval]]]:
    """Roll-ups (task "") per `suite/category`, by round."""
    series: dict[str, list[tuple[int, Eval]]] = defaultdict(list)
    for number, record in run.evals.values():
        name = f"{record.suite}/{record.category}" if record.category else record.suite
        series[name].append((number, record))
    return {name: sorted(points, key=lambda p: p[0]) for name, points in sorted(series.items())}


TrainSeries = dict[str, dict[str, list[tuple[int, float]]]]


def train_series(run: RunData) -> TrainSeries:
    """stat -> line -> [(step, value)]: one line ("all") while every step has one record, one
    line per `role` when roles were trained in separate steps sharing step numbers. Advantage
    stats are the `<role>_adv_mean|std|min|max` keys."""
    records = sorted(run.train.values(), key=lambda r: (r.step, r.role))
    per_role = any(count > 1 for count in Counter(r.step for r in records).values())
    series: TrainSeries = defaultdict(lambda: defaultdict(list))
    for record in records:
        for key, value in record.stats.items():
            if key in TRAIN_STATS or ADVANTAGE_KEY.fullmatch(key):
                series[key][record.role if per_role else "all"].append((record.step, float(value)))
    return series


def role_steps(run: RunData) -> dict[str, tuple[int, int, int]]:
    """role -> (steps, first step, last step)."""
    steps: dict[str, list[int]] = defaultdict(list)
    for record in run.train.values():
        steps[record.role].append(record.step)
    return {role: (len(s), min(s), max(s)) for role, s in sorted(steps.items())}


@dataclass(frozen=True)
class Signal:
    """What the train records say about the learning signal, in words."""

    learned: bool | None  # None: the records carry no advantage stats to tell
    notes: list[str]  # one line per role (no samples; every advantage 0)
    flat: dict[str, float]  # stat -> its value in every step (drawn as words, not curves)


def training_signal(run: RunData, series: TrainSeries) -> Signal:
    roles = {"agent": [0, 0], "designer": [0, 0]}  # steps with samples, with a nonzero advantage
    for record in run.train.values():
        for role, counts in roles.items():
            stats = {key: record.stats.get(f"{role}_adv_{key}")
                     for key in ("n", "mean", "std", "min", "max")}
            if stats["n"] == 0 or all(value is None for value in stats.values()):
                continue
            counts[0] += 1
            counts[1] += any(stats[key] for key in ("mean", "std", "min", "max"))
    notes = []
    for role, (sampled, moving) in roles.items():
        if not sampled:
            notes.append(f"no {role} samples in any step")
        elif not moving:
            notes.append(f"{role}: every advantage was 0 in all {sampled} steps "
                         f"({ROLE_SAME_REWARD[role]})")
    known = any(sampled for sampled, _ in roles.values())
    learned = any(moving for _, moving in roles.values()) if known else None
    flats = {}
    for key in sorted(series, key=lambda k: (k not in TRAIN_STATS, k)):
        values = [value for points in series[key].values() for _, value in points]
        if flat(values):
            flats[key] = max(values, key=abs)
    return Signal(learned, notes, flats)
