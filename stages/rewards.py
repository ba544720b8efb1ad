"""Reward and advantage formulas: pure functions, constants in one frozen config.

In: rewards of plays (floats), win rates, regrets. Out: the designer's raw reward and
advantage, the agent's advantages. Guarantees: never NaN or inf; every constant comes from
`RewardConfig` so recipes can change it; formulas as in SPADE.md (Rewards).

- regret = mean(hinted rewards) - mean(no-hint rewards of the same round), 0 for a side
  without plays
- regret_n = clip(regret / regret_scale, 0, 1)
- plateau(win) = 1 on [band_low, band_high], linear to 0 at ramp_low and at ramp_high
- designer raw (variant "blend") = regret_weight * regret_n + plateau_weight * plateau(win);
  "solve_rate" = plateau(win); "regret" = max(0, regret) / regret_scale (not capped), or
  `step_timeout_penalty` for an env whose step timed out; "learning_potential" = |win - mu(skill)|
  with mu <- (1 - gamma) * mu + gamma * (the skill's mean reward), updated with the current
  window before scoring (reference: learning_potential.py, delayed_env_rewards.py)
- with `chance_adjusted`, plateau scores the win above chance instead of the win:
  (win - chance) / (1 - chance), chance being the env's blind win rate (stages/trivial.py), so
  a coin flip's 0.5 earns what a no-win earns (an ablation; the paper scores the win itself)
- with `variance_term`, any variant adds exp(-(var(window rewards) - 0.25)^2 / 0.02), the
  reference's solver-variance reward (spade/core/utils/rewards.py:11-13)
- designer advantage = (raw - mean raw of the same skill in the batch) * scale, scale capped
- agent advantage = (reward - mean) / (std + eps) within the plays of one env
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean, pstdev, pvariance
from typing import Sequence

VARIANTS = ("blend", "solve_rate", "regret", "learning_potential")


@dataclass(frozen=True)
class RewardConfig:
    variant: str = "blend"
    regret_scale: float = 0.15
    regret_weight: float = 0.4
    plateau_weight: float = 0.6
    band_low: float = 0.4
    band_high: float = 0.6
    ramp_low: float = 0.15
    ramp_high: float = 0.85
    failed_play_reward: float = -1.0  # a play whose env step raised counts this (reference)
    step_timeout_penalty: float = -0.5  # `regret` variant: an env whose step timed out (reference)
    ema_gamma: float = 0.85  # learning potential: weight of the newest skill mean (gamma_slow)
    variance_term: bool = False  # add the solver-variance term to the raw reward
    chance_adjusted: bool = False  # plateau of the win above chance (not the paper's)
    invalid_penalty: float = 0.0  # designer raw reward for envs whose plays mostly broke
    reject_penalty: float | None = None  # None: rejected designs are discarded, never trained
    scale_cap: float = 50.0
    adv_eps: float = 1e-8


def clip(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def mean_or(values: Sequence[float], default: float | None) -> float | None:
    return fmean(values) if values else default


def regret(hinted: Sequence[float], no_hint: Sequence[float]) -> float:
    """mean(hinted) - mean(no_hint), a side without plays counting 0 (the reference's r_hint
    when no hint could be written, and its mean of an empty step)."""
    return mean_or(hinted, 0.0) - mean_or(no_hint, 0.0)


def regret_n(value: float, cfg: RewardConfig) -> float:
    return clip(value / cfg.regret_scale, 0.0, 1.0)


def plateau(win: float, cfg: RewardConfig) -> float:
    if cfg.band_low <= win <= cfg.band_high:
        return 1.0
    if win < cfg.band_low:
        return clip((win - cfg.ramp_low) / (cfg.band_low - cfg.ramp_low), 0.0, 1.0)
    return clip((cfg.ramp_high - win) / (cfg.ramp_high - cfg.band_high), 0.0, 1.0)


def above_chance(win: float, chance: float) -> float:
    """The win rescaled so that chance level is 0 and a sure win 1 (below chance: negative)."""
    return (win - chance) / (1 - chance) if chance < 1 else 0.0


def plateau_win(win: float, chance: float | None, cfg: RewardConfig) -> float:
    """The win that plateau scores: the win itself, or with `chance_adjusted` the win above
    the env's chance level (where it has one)."""
    return above_chance(win, chance) if cfg.chance_adjusted and chance is not None else win


def designer_raw(win: float, regret_value: float, cfg: RewardConfig,
                 skill_ema: float | None = None, plays: Sequence[float] = (),
                 chance: float | None = None) -> float:
    """The variant's reward for one env; `plays` are the window's rewards (variance term)."""
    extra = variance_term(plays) if cfg.variance_term and len(plays) > 1 else 0.0
    level = plateau(plateau_win(win, chance, cfg), cfg)
    if cfg.variant == "blend":
        return cfg.regret_weight * regret_n(regret_value, cfg) + cfg.plateau_weight * level + extra
    if cfg.variant == "solve_rate":
        return level + extra
    if cfg.variant == "regret":  # floored, not capped, as the reference's regret variant
        return max(0.0, regret_value) / cfg.regret_scale + extra
    if cfg.variant == "learning_potential":
        return abs(win - (win if skill_ema is None else skill_ema)) + extra
    raise ValueError(f"unknown reward variant {cfg.variant!r} (one of {', '.join(VARIANTS)})")


def variance_term(plays: Sequence[float]) -> float:
    """exp(-(var - 0.25)^2 / (2 * 0.01)) of the plays' population variance: 1 at the variance of
    a fair win/loss coin (0.25), 0.04 when every play scores the same. Reference:
    compute_variance_reward, spade/core/utils/rewards.py:11-13 (np.var, sigma^2 = 0.01)."""
    return math.exp(-((pvariance(plays) - 0.25) ** 2) / (2 * 0.01))


def ema(previous: float | None, value: float, gamma: float) -> float:
    """gamma weights the new value, as in the reference's trackers; the first value starts it."""
    return value if previous is None else (1 - gamma) * previous + gamma * value


def designer_advantages(raws: Sequence[float], skills: Sequence[str], scale: float,
                        cfg: RewardConfig) -> list[float]:
    """Centre each raw reward on its skill's batch mean and scale; no std division."""
    by_skill: dict[str, list[float]] = {}
    for raw, skill in zip(raws, skills):
        by_skill.setdefault(skill, []).append(raw)
    factor = min(scale, cfg.scale_cap)
    return [(raw - fmean(by_skill[skill])) * factor for raw, skill in zip(raws, skills)]


def designer_scale(agent_samples: int, envs: int, window: int, cfg: RewardConfig) -> float:
    """Weight designer samples like the agent samples they stand for: N_agent/N_env * k, with
    N_agent the no-hint plays of the round and N_env the designer samples scored (the games
    recipes: 8 plays x 24 envs / 24 * 4 = 32); 1 when either count is 0, as the reference."""
    if envs <= 0 or agent_samples <= 0:
        return 1.0
    return min(agent_samples / envs * window, cfg.scale_cap)


def agent_advantages(rewards: Sequence[float], cfg: RewardConfig) -> list[float]:
    """z-score within one env's plays; all-equal groups give zeros (no signal)."""
    if len(rewards) < 2 or max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    mu, sigma = fmean(rewards), pstdev(rewards)
    return [(r - mu) / (sigma + cfg.adv_eps) for r in rewards]

