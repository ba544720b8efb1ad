"""score-regret: per env, how much the hint helped and what the designer earns for it.

In: `rollout` records (hinted and no-hint plays, any rounds) with their `judgement` records,
`env` records (skill, lineage),
optionally `validation` rejects (scored only when `reject_penalty` is set) and earlier `regret`
records (the per-skill reward EMA of the learning-potential variant).
Out: one `regret` record per env with plays (and, with a reject penalty, one per rejected
design), in first-seen order: hint and no-hint means, regret, regret_n, win, plateau, designer
raw reward and advantage, the design id the reward belongs to; plus round diagnostics.
Guarantees: pure (no I/O) and deterministic; matched timing: regret compares hinted plays with
the no-hint plays of the round the hinted plays were made in (or, where none of those has a
reward, of the first later round that has: the reference's first offset), a side without
plays counting 0; win is the mean reward of every no-hint play of the window
[round - window + 1, round]. Plays count as the reference's completed plays do: a step that
raised after the agent acted scores -1 (`failed_play_reward`), in regret and win alike; a hang,
a blown limit, a blacklisted play or a load or reset that failed has no reward and is in no
mean (`counted`); `solve_rate` is the share of the window's plays with reward > 0 (the
reference's memory win rate). In the `regret` variant an env with a step that timed out earns
`step_timeout_penalty` (-0.5), as in the reference. An env whose plays mostly broke earns the
invalid penalty, and so does an env whose hint gives its answer away (`meta.hint.leak`,
stages/hint.py, or a `leak` judgement: hinted winners' actions that win other seeds,
stages/judge.py: its regret measures the leak, not learnability; `hint_leaks` on the record) or
could not be checked because the env stalled the check (`meta.hint.leak.stalled`), and so does
an env whose no-hint winners' actions win other seeds (a `shortcut` judgement: `shortcut` on
the record);
rejected designs are discarded by default (the paper: they earn nothing), so
they neither train nor move their skill's mean; with a reject penalty, each design
conversation that never became an env is penalised once. An env from a repair (a later
designer turn) pays its conversation's turn-1 design 0, the reference's rule; with
`train_repairs` it pays the whole conversation its reward (`designer_sample` on the record). A play spade could not record (outcome
`internal_error`) counts as broken too, and an env whose regret record cannot be built or
written (a case spade does not handle yet) gets a broken record with `ok: false` and an
`internal.*` error, counted in `Diagnostics.internal` (stages/isolation.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import fmean
from typing import Iterable

from stages import judge, rewards
from stages.leaks import leaking
from stages.isolation import INTERNAL, isolated
from stages.records import (Env, Failure, Judgement, Record, Regret, Rollout, Validation,
                            conversation_of, designer_turn)
from stages.rewards import RewardConfig

# what the env broke: a crash, a hang, its limits, its clock over a play (`env_budget`), or
# plays not made because it had stalled before (`blacklisted`, stages/rollout.py)
ENV_FAULTS = ("program_error", "timeout", "oom", "output_limit", "sandbox_failure",
              "env_budget", "blacklisted", INTERNAL)
STALLED = ("timeout", "env_budget", "blacklisted")  # the reference's step timeout


@dataclass(frozen=True)
class Config:
    round: int = 0
    window: int = 4
    rewards: RewardConfig = field(default_factory=RewardConfig)
    learnable_band: tuple[float, float] = (0.2, 0.8)
    train_repairs: bool = False  # a repaired env pays its whole conversation, not turn 1 0


@dataclass
class Diagnostics:
    envs: int = 0
    learnable_share: float = 0.0
    mean_win: float = 0.0
    regret_mean: float = 0.0
    regret_quartiles: tuple[float, float, float] = (0.0, 0.0, 0.0)
    zero_variance_share: float = 0.0
    invalid: int = 0
    internal: int = 0
    hint_leaks: int = 0
    at_chance: int = 0
    shortcuts: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def run(records: Iterable[Record], cfg: Config) -> tuple[list[Regret], Diagnostics]:
    envs: dict[str, Env] = {}
    plays: dict[str, list[Rollout]] = defaultdict(list)
    rejects: list[Validation] = []
    history: list[Regret] = []
    judged: list[Judgement] = []
    for record in records:
        if isinstance(record, Env):
            envs.setdefault(record.id, record)
        elif isinstance(record, Rollout):
            plays[record.env_id].append(record)
        elif isinstance(record, Validation):
            rejects.append(record)
        elif isinstance(record, Regret) and record.round < cfg.round:
            history.append(record)
        elif isinstance(record, Judgement) and record.round <= cfg.round:
            judged.append(record)
    condemned = (judge.condemned(judged, ("shortcut",)), judge.condemned(judged, ("leak",)))
    skill_ema = _skill_ema(history, _window_means(plays, envs, cfg), cfg)
    scored = [isolated(f"score-regret: env {env_id}",
                       lambda: _score(env_id, plays[env_id], envs.get(env_id), skill_ema, cfg,
                                      condemned),
                       lambda failure: _unscored(env_id, envs.get(env_id), failure, cfg))
              for env_id in plays]
    if cfg.rewards.reject_penalty is not None:
        scored += [_invalid(reject, cfg) for reject in unrepaired(rejects, envs.values())]
    n_agent = sum(1 for group in plays.values() for p in group
                  if not p.hint and p.round == cfg.round)
    scale = rewards.designer_scale(n_agent, max(1, len(scored)), cfg.window, cfg.rewards)
    advantages = rewards.designer_advantages([r.designer_reward for r in scored],
                                             [r.skill for r in scored], scale, cfg.rewards)
    out = [r.model_copy(update={"designer_advantage": a, "meta": {**r.meta, "scale": scale}})
           for r, a in zip(scored, advantages)]
    return out, _diagnostics(out, plays, cfg)


def _score(env_id: str, plays: list[Rollout], env: Env | None, skill_ema: dict[str, float],
           cfg: Config, condemned: tuple[set[str], set[str]] = (set(), set())) -> Regret:
    rc = cfg.rewards
    hinted = [p for p in plays if p.hint]
    hint_round = max((p.round for p in hinted), default=None)
    hinted = [_raw(p, rc) for p in hinted if p.round == hint_round and counted(p)]
    matched = _matched(plays, hint_round, rc)
    window = [p for p in _window(plays, cfg) if counted(p)]
    window_rewards = [_raw(p, rc) for p in window]
    win = fmean(window_rewards) if window else 0.0
    regret = rewards.regret(hinted, matched)
    skill = env.skill if env else ""
    broken = sum(p.outcome in ENV_FAULTS for p in plays) * 2 > len(plays)
    shortcuts, leaked = condemned
    shortcut = env_id in shortcuts
    leaks = (env is not None and leaking(env)) or env_id in leaked
    chance = recorded_chance(env)
    if rc.variant == "regret" and any(p.outcome in STALLED for p in plays):
        raw = rc.step_timeout_penalty  # the reference's regret variant, before anything else
    elif broken or leaks or shortcut:
        raw = rc.invalid_penalty
    else:
        raw = rewards.designer_raw(win, regret, rc, skill_ema.get(skill), window_rewards, chance)
    design_id, raw, sample = _credit(env, raw, cfg)
    return Regret(env_id=env_id, skill=skill, round=cfg.round,
                  hint_reward=rewards.mean_or(hinted, None),
                  no_hint_reward=rewards.mean_or(matched, None), regret=regret, win=win,
                  solve_rate=fmean(r > 0 for r in window_rewards) if window else 0.0,
                  designer_reward=raw, parents=[env_id] + ([design_id] if design_id else []),
                  policy=env.policy if env else None,
                  regret_n=rewards.regret_n(regret, rc),
                  plateau=rewards.plateau(rewards.plateau_win(win, chance, rc), rc),
                  design_id=design_id, n_hint=len(hinted), n_no_hint=len(window),
                  variant=rc.variant, broken=broken, hint_leaks=leaks, chance=chance,
                  at_chance=at_chance(win, chance, len(window)), designer_sample=sample,
                  shortcut=shortcut)


def _credit(env: Env | None, raw: float, cfg: Config) -> tuple[str | None, float, str]:
    """Which design an env's reward trains, what it earns, and as which sample. An env from a
    repair pays its conversation's turn-1 design 0 (the reference's `turn1_valid`: the designer
    is paid only for what it got right unaided), or with `train_repairs` pays the whole
    conversation (its last design) the env's reward."""
    design_id = env.parents[0] if env and env.parents else None
    if env is None or designer_turn(env) == 1:
        return design_id, raw, "first_turn"
    if cfg.train_repairs:
        return design_id, raw, "conversation"
    return conversation_of(env), 0.0, "first_turn"


def recorded_chance(env: Env | None) -> float | None:
    """The env's chance level as validation recorded it (`meta.trivial.chance`)."""
    value = ((env.meta if env else {}).get("trivial") or {}).get("chance")
    return float(value) if isinstance(value, (int, float)) else None


def at_chance(win: float, chance: float | None, plays: int) -> bool:
    """Whether a no-hint win over `plays` plays is within two binomial standard errors of a
    chance level a blind player can reach (above 0): the band would pay luck."""
    if chance is None or chance <= 0 or plays == 0:
        return False
    return abs(win - chance) <= 2 * math.sqrt(chance * (1 - chance) / plays)


def _window(plays: list[Rollout], cfg: Config) -> list[Rollout]:
    return [p for p in plays if not p.hint and cfg.round - cfg.window < p.round <= cfg.round]


def _matched(plays: list[Rollout], hint_round: int | None, rc: RewardConfig) -> list[float]:
    """The no-hint rewards regret compares the hint with: the hint round's, or where none of
    those counted, the first later round's that has some (the reference's first offset); with
    no hinted plays at all (a hint that could not be written), the first round's."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for play in plays:
        if not play.hint and play.round >= (hint_round or 0) and counted(play):
            by_round[play.round].append(_raw(play, rc))
    return by_round[min(by_round)] if by_round else []


def counted(play: Rollout) -> bool:
    """Whether a play has a reward, as the reference's completed plays do: a step that raised
    after the agent acted ends the play (reward `failed_play_reward`); a hang, a blown limit or
    a load or reset that failed leaves no trajectory, so it is left out of every mean."""
    return play.ok or (play.outcome == "program_error" and bool(play.turns))


def _raw(play: Rollout, rc: RewardConfig) -> float:
    return rc.failed_play_reward if play.outcome in ENV_FAULTS else play.reward


def _window_means(plays: dict[str, list[Rollout]], envs: dict[str, Env],
                  cfg: Config) -> dict[str, float]:
    """Each skill's mean raw reward over the window's no-hint plays (all its envs pooled)."""
    by_skill: dict[str, list[float]] = defaultdict(list)
    for env_id, group in plays.items():
        skill = envs[env_id].skill if env_id in envs else ""
        by_skill[skill] += [_raw(p, cfg.rewards) for p in _window(group, cfg) if counted(p)]
    return {skill: fmean(values) for skill, values in by_skill.items() if values}


def _unscored(env_id: str, env: Env | None, failure: Failure, cfg: Config) -> Regret:
    design_id = env.parents[0] if env and env.parents else None
    return Regret(env_id=env_id, skill=env.skill if env else "", round=cfg.round, regret=0.0,
                  win=0.0, designer_reward=cfg.rewards.invalid_penalty,
                  parents=[env_id] + ([design_id] if design_id else []),
                  policy=env.policy if env else None, design_id=design_id,
                  variant=cfg.rewards.variant, broken=True, ok=False, error=failure)


def unrepaired(rejects: list[Validation], envs: Iterable[Env]) -> list[Validation]:
    """The last reject of each design conversation that no repair turned into an env: one
    penalty per conversation, none for one that ended valid (its env pays it)."""
    valid = {conversation_of(env) for env in envs}
    last: dict[str | None, Validation] = {}
    for reject in rejects:
        key = conversation_of(reject)
        if key not in valid and (key not in last or designer_turn(reject) >
                                 designer_turn(last[key])):
            last[key] = reject
    return list(last.values())


def _invalid(reject: Validation, cfg: Config) -> Regret:
    design_id = reject.parents[0] if reject.parents else None
    sample = "first_turn"
    if designer_turn(reject) > 1:  # a conversation that stayed invalid
        design_id, sample = (design_id, "conversation") if cfg.train_repairs \
            else (conversation_of(reject), "first_turn")
    return Regret(env_id="", skill=reject.skill, round=cfg.round, regret=0.0, win=0.0,
                  designer_reward=cfg.rewards.reject_penalty, parents=list(reject.parents),
                  policy=reject.policy, design_id=design_id, variant=cfg.rewards.variant,
                  broken=True, rejected_by=reject.check, designer_sample=sample)


def _skill_ema(history: list[Regret], current: dict[str, float],
               cfg: Config) -> dict[str, float]:
    """Per skill: the EMA of the mean reward of each earlier env set, updated once per set as
    the reference does (with the set's plays pooled over its whole window: the regret records
    of the set's last round, each env's win weighted by its plays), then with the current
    window (the reference updates its tracker before it scores)."""
    k = cfg.window
    set_start = cfg.round - cfg.round % k
    by_set: dict[str, dict[int, list[tuple[float, int]]]] = defaultdict(lambda: defaultdict(list))
    for record in history:
        if record.env_id and record.round < set_start and record.round % k == k - 1:
            by_set[record.skill][record.round].append((record.win, record.n_no_hint))
    state: dict[str, float] = {}
    for skill in set(by_set) | set(current):
        value = None
        for closing in sorted(by_set.get(skill, {})):
            value = rewards.ema(value, _pooled(by_set[skill][closing]), cfg.rewards.ema_gamma)
        if skill in current:
            value = rewards.ema(value, current[skill], cfg.rewards.ema_gamma)
        state[skill] = value
    return state


def _pooled(wins: list[tuple[float, int]]) -> float:
    """The mean reward over every play behind (win, plays) pairs."""
    plays = sum(n for _, n in wins)
    return sum(w * n for w, n in wins) / plays if plays else fmean(w for w, _ in wins)


def _diagnostics(scored: list[Regret], plays: dict[str, list[Rollout]], cfg: Config) -> Diagnostics:
    valid = [r for r in scored if r.env_id and not r.broken]
    internal = sum(1 for r in scored if r.error and r.error.type.startswith("internal."))
    if not valid:
        return Diagnostics(invalid=len(scored), internal=internal,
                           hint_leaks=sum(r.hint_leaks for r in scored),
                           shortcuts=sum(r.shortcut for r in scored))
    low, high = cfg.learnable_band
    regrets = sorted(r.regret for r in valid)
    quartiles = tuple(regrets[int(q * (len(regrets) - 1))] for q in (0.25, 0.5, 0.75))
    groups = [[p.reward for p in plays[r.env_id] if not p.hint and p.round == cfg.round]
              for r in valid]
    groups = [g for g in groups if g]
    flat = sum(1 for g in groups if len(set(g)) == 1)
    return Diagnostics(envs=len(valid),
                       learnable_share=fmean(low <= r.win <= high for r in valid),
                       mean_win=fmean(r.win for r in valid), regret_mean=fmean(regrets),
                       regret_quartiles=quartiles,  # type: ignore[arg-type]
                       zero_variance_share=flat / len(groups) if groups else 0.0,
                       invalid=len(scored) - len(valid), internal=internal,
                       hint_leaks=sum(r.hint_leaks for r in scored),
                       at_chance=sum(r.at_chance for r in valid),
                       shortcuts=sum(r.shortcut for r in scored))
