"""The report's numbers: per-round tables computed from a `RunData`, no drawing, no HTML.

In: a `RunData` (stages.report.data). Out: plain dataclasses and dicts keyed by round: no-hint
reward, win rates and learnable share, regret and designer reward, acceptance of the model's
designs (per round, per attempt, overall, reject reasons by check), skill mix, eval series, the
retention curve (the first env set's mean score per eval point, and each env's first and latest
score), train series, and what the training records say about the learning signal; where
training statistics cross the collapse thresholds below; the regret rows carried over from
earlier rounds; per round the completion length and throughput of the plays.
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
TRAIN_STATS = ("loss", "entropy", "grad_norm", "clip_frac", "approx_kl", "kl_ref", "tis_weight",
               "lr")
# Collapse: training statistics past these say the policy is no longer learning but breaking.
# Entropy below this share of its first step's value: the policy samples (nearly) one token
# everywhere (7.6 -> 3e-5 on a collapsed quickstart); a healthy GRPO run loses entropy by a few
# times over a run, not a hundredfold.
ENTROPY_FLOOR = 0.01
# More than half of the loss tokens clipped: the updated policy is outside the PPO trust region
# for most tokens, so most of the batch gives no gradient (healthy runs sit near 0.05-0.2).
CLIP_FRAC_MAX = 0.5
# approx_kl (mean of (Δ logprob)² / 2 per token) above 1: a token's probability moves by about
# e^1.4 ≈ 4x in one step; PPO's usual early-stopping target is 0.01-0.05, so 1 is far past it.
APPROX_KL_MAX = 1.0
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
    how many scored envs had a hint that gives the answer away (read or replayed), how many
    paid a shortcut (stages/judge.py) and what judging them cost in jail-seconds, and how many
    a no-hint win within noise of their chance level."""
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
                       "shortcuts": sum(r.shortcut for r in records if r.env_id),
                       "judging_seconds": sum(j.meta.get("jail_seconds", 0.0)
                                              for j in run.judgements.get(number, [])),
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


def accepted_designs(run: RunData) -> set[str]:
    origins = run.origins()
    return {parent for envs in run.envs.values() for env_id, env in envs.items()
            if origins[env_id] == "designed" for parent in env.parents}


def verdicts(run: RunData) -> list[Verdict]:
    """One per design of this run (and per reject whose design record is not in the run)."""
    rejected = run.rejected_designs()
    accepted = accepted_designs(run)
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


def turn_yield(run: RunData) -> dict[int, list[tuple[int, int]]]:
    """Per round with repairs: for turn 1, 2, ... the (slots filled by then, slots): a slot is
    filled at the first designer turn whose design was accepted."""
    accepted = accepted_designs(run)
    out = {}
    for number in sorted({d.round for d in run.designs.values()}):
        designs = [(d, i) for i, d in run.designs.items() if d.round == number]
        last = max(d.turn for d, _ in designs)
        if last == 1:
            continue
        filled: dict[int, int] = {}  # slot -> the turn that filled it
        for design, design_id in designs:
            if design_id in accepted:
                filled[design.slot] = min(filled.get(design.slot, design.turn), design.turn)
        slots = len({d.slot for d, _ in designs})
        out[number] = [(sum(t <= turn for t in filled.values()), slots)
                       for turn in range(1, last + 1)]
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


@dataclass(frozen=True)
class RetentionPoint:
    """One eval point's play of the retention envs (a seeded sample of the first env set)."""

    round: int
    envs: int  # envs scored (items that did not fail)
    failed: int  # items that failed (left out, as the eval roll-ups leave them out)
    score: float  # the mean of their no-hint success rates
    ci_low: float | None  # the eval's own overall roll-up interval, where it wrote one
    ci_high: float | None


def retention_curve(run: RunData) -> list[RetentionPoint]:
    """Per eval point with retention evals, by round: the envs' mean score and its interval."""
    points = []
    for number in sorted(run.retention):
        items = run.retention[number].values()
        scores = [item.score for item in items if item.ok]
        if not scores:
            continue
        overall = run.retention_overall.get(number)
        points.append(RetentionPoint(number, len(scores), len(items) - len(scores),
                                     mean(scores), overall.ci_low if overall else None,
                                     overall.ci_high if overall else None))
    return points


def retention_by_env(run: RunData) -> dict[str, tuple[tuple[int, float], tuple[int, float]]]:
    """env id -> ((round, score) at its first eval point, (round, score) at its latest)."""
    seen: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for number in sorted(run.retention):
        for env_id, item in sorted(run.retention[number].items()):
            if item.ok:
                seen[env_id].append((number, float(item.score)))
    return {env_id: (scores[0], scores[-1]) for env_id, scores in seen.items()}


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


@dataclass(frozen=True)
class Collapse:
    """A training statistic past its collapse threshold: where it started and how far it went."""

    stat: str
    line: str  # "all", or the role whose steps cross it
    step: int  # the first step past the threshold
    round: int | None  # the round directory of that step's record
    steps: int  # steps past the threshold
    of: int  # steps that record the stat
    worst: float  # the lowest entropy, the highest clip_frac or approx_kl
    worst_step: int
    text: str


def _step_rounds(run: RunData) -> dict[int, int]:
    out: dict[int, int] = {}
    for record_id, record in run.train.items():
        number = run.train_rounds.get(record_id)
        if number is not None:
            out[record.step] = min(number, out.get(record.step, number))
    return out


def collapse(run: RunData, series: TrainSeries | None = None) -> list[Collapse]:
    """One finding per statistic (and line) past ENTROPY_FLOOR, CLIP_FRAC_MAX, APPROX_KL_MAX."""
    series = train_series(run) if series is None else series
    rounds = _step_rounds(run)
    found = []
    for stat in ("entropy", "clip_frac", "approx_kl"):
        for line, points in series.get(stat, {}).items():
            points = [(step, value) for step, value in points if math.isfinite(value)]
            if not points:
                continue
            if stat == "entropy":
                first = points[0][1]
                if not first > 0:
                    continue
                limit = ENTROPY_FLOOR * first
                past = [(s, v) for s, v in points if v < limit]
                worst_step, worst = min(points, key=lambda p: p[1])
                words = (f"entropy collapse: below {ENTROPY_FLOOR:.0%} of its first value "
                         f"({first:.3g} at step {points[0][0]})")
                tail = f"lowest {worst:.3g} at step {worst_step}"
            else:
                limit = CLIP_FRAC_MAX if stat == "clip_frac" else APPROX_KL_MAX
                past = [(s, v) for s, v in points if v > limit]
                worst_step, worst = max(points, key=lambda p: p[1])
                words = f"{stat} above {limit:g}"
                tail = f"peak {worst:.3g} at step {worst_step}"
            if not past:
                continue
            step = past[0][0]
            number = rounds.get(step)
            where = f"step {step}" + (f" (r{number:02d})" if number is not None else "")
            role = "" if line == "all" else f" [{line}]"
            text = (f"{words}{role} from {where} on: {len(past)} of {len(points)} steps past "
                    f"it, {tail}.")
            found.append(Collapse(stat, line, step, number, len(past), len(points), worst,
                                  worst_step, text[0].upper() + text[1:]))
    return found


def carried_over(run: RunData) -> dict[int, list[str]]:
    """Per round: the scored envs (regret records, broken ones left out) with no play of their
    own in that round: their numbers are from earlier rounds' plays (score-regret's window)."""
    out = {}
    for number in run.all_rounds():
        envs = sorted({r.env_id for r in run.regrets.get(number, {}).values()
                       if r.env_id and not r.broken} - run.played.get(number, set()))
        if run.regrets.get(number):
            out[number] = envs
    return out


@dataclass(frozen=True)
class PlayRates:
    plays: int  # plays read in the round (hinted and not)
    completions: int  # turns recording completion_ids
    mean_tokens: float | None  # completion tokens per completion
    timed_plays: int  # plays in stage directories whose manifest records seconds
    seconds: float | None  # those directories' wall time
    plays_per_s: float | None
    tokens_per_s: float | None
    train_tokens_per_s: float | None  # loss tokens / seconds of the round's train records


def play_rates(run: RunData) -> dict[int, PlayRates]:
    """Per round: completion length, and rollout throughput over the stages' wall time."""
    train: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for record_id, record in run.train.items():
        seconds = record.meta.get("seconds")
        tokens = record.stats.get("loss_tokens")
        if isinstance(seconds, (int, float)) and seconds > 0 and tokens is not None:
            number = run.train_rounds.get(record_id, 0)
            train[number][0] += float(tokens)
            train[number][1] += float(seconds)
    out = {}
    for number in sorted(set(run.tallies) | set(train)):
        tallies = list(run.tallies.get(number, {}).values())
        plays = sum(t.plays for t in tallies)
        completions = sum(t.completions for t in tallies)
        tokens = sum(t.tokens for t in tallies)
        timed = [t for t in tallies if t.seconds is not None and t.plays]
        seconds = math.fsum(t.seconds for t in timed) if timed else None
        timed_tokens = sum(t.tokens for t in timed)
        out[number] = PlayRates(
            plays, completions, tokens / completions if completions else None,
            sum(t.plays for t in timed), seconds,
            sum(t.plays for t in timed) / seconds if seconds else None,
            timed_tokens / seconds if seconds and any(t.completions for t in timed) else None,
            train[number][0] / train[number][1] if number in train else None)
    return out
