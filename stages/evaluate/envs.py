"""Held-out env suite `envs`: env records played without the hint.

In: env records (e.g. held-out designed envs), a backend, Config (episodes, default 8; `rollout`
an optional stages.rollout.Config template for the sandbox and turn caps; categories/limit
applied by `_limited_envs`).
Out: one `eval` item per env: `score` = success rate (reward > 0) over its plays, category =
the env's skill (else its domain), parents = [env id], details with mean reward, mean turns and
outcome counts.
Guarantees: plays go through `stages.rollout.run`, jailed as always.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from stages.backends import Backend
from stages.evaluate.rollup import _count, item
from stages.records import Eval

if TYPE_CHECKING:
    from stages.evaluate import Config


def run_envs(envs: Iterable[Any], backend: Backend, cfg: Config, stats: Any = None
             ) -> Iterator[Eval]:
    """Play each env `episodes` times without the hint; score = success rate (reward > 0)."""
    from stages import rollout

    template = cfg.rollout or rollout.Config()
    rcfg = rollout.Config(**{**template.__dict__, "plays": cfg.n_episodes, "hint": False,
                             "round": cfg.round or 0, "seed": cfg.seed,
                             "prompts_dir": cfg.prompts_dir, "sampling": cfg.sampling,
                             "concurrency": max(1, cfg.batch_size)})
    envs = list(envs)
    by_id = {env.id: env for env in envs}
    plays: dict[str, list] = {}
    for play in rollout.run(envs, backend, rcfg):
        plays.setdefault(play.env_id, []).append(play)
        if play.outcome != "ok":
            _count(stats, f"env.{play.outcome}")
        if len(plays[play.env_id]) == rcfg.plays:
            env = by_id[play.env_id]
            done = plays.pop(play.env_id)
            rewards = [p.reward for p in done]
            outcomes: dict[str, int] = {}
            for p in done:
                outcomes[p.outcome] = outcomes.get(p.outcome, 0) + 1
            yield item(cfg, env.id, env.skill or env.domain, [float(r > 0) for r in rewards],
                       backend.policy, {"class_name": env.class_name, "domain": env.domain,
                                        "mean_reward": statistics.fmean(rewards),
                                        "mean_turns": statistics.fmean(len(p.turns) for p in done),
                                        "outcomes": outcomes},
                       parents=[env.id])


def _limited_envs(envs: Iterable[Any], cfg: Config) -> Iterator[Any]:
    wanted = {c.lower() for c in cfg.categories}
    seen: dict[str, int] = {}
    for env in envs:
        category = env.skill or env.domain
        if wanted and category.lower() not in wanted:
            continue
        seen[category] = seen.get(category, 0) + 1
        if cfg.limit is None or seen[category] <= cfg.limit:
            yield env
