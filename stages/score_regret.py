"""score-regret: per env, how much the hint helped and what the designer earns for it.

In: `rollout` records (hinted and no-hint plays, any rounds), `env` records (skill, lineage),
optionally `validation` rejects (designs that earn the invalid penalty) and earlier `regret`
records (the per-skill win-rate EMA of the learning-potential variant).
Out: one `regret` record per env with plays and one per rejected design, in first-seen order:
hint and no-hint means, regret, regret_n, win, plateau, designer raw reward and advantage, the
design id the reward belongs to; plus round diagnostics in `Diagnostics`.
Guarantees: pure (no I/O) and deterministic; matched timing: regret compares hinted plays with
the no-hint plays of the round the hinted plays were made in; win uses every no-hint play of
the window [round - window + 1, round]; an env whose plays mostly ended in a sandbox failure
outcome (crash, hang, memory, output) earns the invalid penalty like a rejected design.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import fmean
from typing import Iterable

from stages import rewards
from stages.records import Env, Record, Regret, Rollout, Validation
from stages.rewards import RewardConfig


@dataclass(frozen=True)
class Config:
    round: int = 0
    window: int = 4
    rewards: RewardConfig = field(default_factory=RewardConfig)
    learnable_band: tuple[float, float] = (0.2, 0.8)


@dataclass
class Diagnostics:
    envs: int = 0
    learnable_share: float = 0.0
    mean_win: float = 0.0
    regret_mean: float = 0.0
    regret_quartiles: tuple[float, float, float] = (0.0, 0.0, 0.0)
    zero_variance_share: float = 0.0
    invalid: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def run(records: Iterable[Record], cfg: Config) -> tuple[list[Regret], Diagnostics]:
    envs: dict[str, Env] = {}
    plays: dict[str, list[Rollout]] = defaultdict(list)
    rejects: list[Validation] = []
    history: list[Regret] = []
    for record in records:
        if isinstance(record, Env):
            envs.setdefault(record.id, record)
        elif isinstance(record, Rollout):
            plays[record.env_id].append(record)
        elif isinstance(record, Validation):
            rejects.append(record)
        elif isinstance(record, Regret) and record.round < cfg.round:
            history.append(record)
    skill_ema = _skill_ema(history, cfg.rewards.ema_gamma)
    scored = [_score(env_id, plays[env_id], envs.get(env_id), skill_ema, cfg) for env_id in plays]
    scored += [_invalid(reject, cfg) for reject in rejects]
    n_agent = sum(len(p) for p in plays.values())
    scale = rewards.designer_scale(n_agent, max(1, len(scored)), cfg.window, cfg.rewards)
    advantages = rewards.designer_advantages([r.designer_reward for r in scored],
                                             [r.skill for r in scored], scale, cfg.rewards)
    out = [r.model_copy(update={"designer_advantage": a, "meta": {**r.meta, "scale": scale}})
           for r, a in zip(scored, advantages)]
    return out, _diagnostics(out, plays, cfg)


def _score(env_id: str, plays: list[Rollout], env: Env | None, skill_ema: dict[str, float],
           cfg: Config) -> Regret:
    rc = cfg.rewards
    hinted = [p for p in plays if p.hint]
    hint_round = max((p.round for p in hinted), default=None)
    hinted = [p for p in hinted if p.round == hint_round]
    matched = [p.reward for p in plays if not p.hint and p.round == hint_round]
    window = [p for p in plays if not p.hint and cfg.round - cfg.window < p.round <= cfg.round]
    win = fmean(p.reward > rc.success_threshold for p in window) if window else 0.0
    regret = rewards.regret([p.reward for p in hinted], matched)
    skill = env.skill if env else ""
    broken = sum(p.outcome not in ("ok",) for p in plays) * 2 > len(plays)
    raw = rc.invalid_penalty if broken else rewards.designer_raw(win, regret, rc,
                                                                 skill_ema.get(skill))
    design_id = env.parents[0] if env and env.parents else None
    return Regret(env_id=env_id, skill=skill, round=cfg.round,
                  hint_reward=rewards.mean_or([p.reward for p in hinted], None),
                  no_hint_reward=rewards.mean_or(matched, None), regret=regret, win=win,
                  designer_reward=raw, parents=[env_id] + ([design_id] if design_id else []),
                  policy=env.policy if env else None,
                  regret_n=rewards.regret_n(regret, rc), plateau=rewards.plateau(win, rc),
                  design_id=design_id, n_hint=len(hinted), n_no_hint=len(window),
                  variant=rc.variant, broken=broken)


def _invalid(reject: Validation, cfg: Config) -> Regret:
    design_id = reject.parents[0] if reject.parents else None
    return Regret(env_id="", skill=reject.skill, round=cfg.round, regret=0.0, win=0.0,
                  designer_reward=cfg.rewards.invalid_penalty, parents=list(reject.parents),
                  policy=reject.policy, design_id=design_id, variant=cfg.rewards.variant,
                  broken=True, rejected_by=reject.check)


def _skill_ema(history: list[Regret], gamma: float) -> dict[str, float]:
    by_round: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in history:
        if record.env_id:
            by_round[record.skill][record.round].append(record.win)
    state: dict[str, float] = {}
    for skill, rounds in by_round.items():
        value = None
        for round_index in sorted(rounds):
            value = rewards.ema(value, fmean(rounds[round_index]), gamma)
        state[skill] = value
    return state


def _diagnostics(scored: list[Regret], plays: dict[str, list[Rollout]], cfg: Config) -> Diagnostics:
    valid = [r for r in scored if r.env_id and not r.broken]
    if not valid:
        return Diagnostics(invalid=len(scored))
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
                       invalid=len(scored) - len(valid))
