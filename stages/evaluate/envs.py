"""Held-out env suite `envs`: env records played without the hint.

In: env records (e.g. held-out designed envs), a backend, Config (episodes, default 8; `rollout`
an optional stages.rollout.Config template for the sandbox and turn caps; categories/limit
applied by `_limited_envs`).
Out: one `eval` item per env: `score` = success rate (reward > 0) over its plays, category =
the env's skill (else its domain), parents = [env id], details with mean reward, mean turns and
outcome counts.
Guarantees: plays go through `stages.rollout.run`, jailed as always, which ends a misbehaving
env's play with its outcome (it scores 0); an env whose item cannot be built or written (a case
spade does not handle yet) becomes a failed item (`ok: false`, left out of the roll-ups) and the
suite goes on (stages/isolation.py).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from stages.backends import Backend
from stages.evaluate.rollup import _count, failed_item, item
from stages.isolation import INTERNAL, isolated
from stages.records import Eval, Failure

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
            yield isolated(f"eval envs: env {env.id}",
                           lambda: _scored(cfg, env, done, backend.policy),
                           lambda failure: _failed(cfg, env, failure, backend.policy, stats))


def _scored(cfg: Config, env: Any, done: list, policy: str | None) -> Eval:
    rewards = [p.reward for p in done]
    outcomes: dict[str, int] = {}
    for p in done:
        outcomes[p.outcome] = outcomes.get(p.outcome, 0) + 1
    return item(cfg, env.id, env.skill or env.domain, [float(r > 0) for r in rewards], policy,
                {"class_name": env.class_name, "domain": env.domain,
                 "mean_reward": statistics.fmean(rewards),
                 "mean_turns": statistics.fmean(len(p.turns) for p in done),
                 "outcomes": outcomes},
                parents=[env.id])


def _failed(cfg: Config, env: Any, failure: Failure, policy: str | None, stats: Any) -> Eval:
    _count(stats, f"env.{INTERNAL}")
    return failed_item(cfg, env.id, env.skill or env.domain, policy, failure.type, failure.msg)


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
