"""judge: replay the plays that won on other seeds of their env, in the jail, as plays.

In: the `env` records a rollout stage played and the `rollout` records it made; a Sandbox;
Config (winners replayed per env, seeds each is replayed on, the env budget of a play).
Out: one `judgement` record per env with a winning play: how many replays of its winners'
actions won on other seeds, the env's chance level, and the verdict:
- no-hint plays whose actions win other seeds beyond chance: `shortcut` (a seed-independent way
  to win that the agent found: the env does not test what it claims, and training on it teaches
  the trick);
- hinted plays whose actions do: `leak` (the hint carries an answer that holds whatever the
  seed, however it is written: in words, arithmetic, base64 or after decoys);
- otherwise `fair`.
Guarantees: a replay looks like a play to the env: a fresh worker, one load and one reset, the
recorded actions sent with the recorded play's pace between calls (`meta.waits`), under the
same env budget as a play; a hang, crash or blown limit in a replay is a replay that did not
win, never a stage failure. The other seeds are the env's validation seeds (drawn from the OS
at validation, so no env can know them), minus the play's own. Work is bounded: at most
`winners x seeds` replays an env, each within one play's env budget; the record says what it
cost in `meta.jail_seconds` (worker lifetimes, waits included) and `meta.env_seconds`.
Beyond chance: at least 2 wins, and so many that a seed-blind player winning at the chance level
reaches them with probability under FALSE_ALARM (the binomial tail; `transfers`). The chance
level is the most any seed-blind player won at validation: another seed's solution replayed
(`meta.trivial.chance`) or the best of the blind policies (`meta.trivial.wins`, such as always
answering `a`), 0 where unknown. A replayed action sequence is itself a seed-blind player, so
one that wins as often as validation's blind players did is what validation accepted as chance,
not a shortcut: on a three-option game any fixed answer wins a third of the seeds.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable

from sandbox.jail import Limits, Reply, Sandbox
from sandbox.pool import WorkerPool
from stages.records import Env, Judgement, Rollout, derive_seed


@dataclass(frozen=True)
class Config:
    winners: int = 2  # winning plays replayed per env
    seeds: int = 3  # other seeds each winner is replayed on
    env_budget: float = 10.0  # env seconds per replay, as per play
    concurrency: int = 32  # replays at once: they mostly wait, as plays wait for the model
    sandbox: Sandbox = field(default_factory=lambda: Sandbox(limits=Limits(call_timeout=10.0)))


@dataclass(frozen=True)
class Replay:
    env: Env
    play: Rollout
    seed: int


@dataclass(frozen=True)
class Replayed:
    won: bool
    jail_seconds: float
    env_seconds: float


def won(play: Rollout) -> bool:
    """A play that ended with a positive reward: what trains the agent towards its actions."""
    return play.ok and play.terminated and play.reward > 0


def winners(plays: Iterable[Rollout], cfg: Config) -> dict[tuple[str, bool], list[Rollout]]:
    """(env id, hinted) -> up to `cfg.winners` winning plays, in the order they were made."""
    found: dict[tuple[str, bool], list[Rollout]] = defaultdict(list)
    for play in plays:
        key = (play.env_id, play.hint)
        if won(play) and len(found[key]) < cfg.winners:
            found[key].append(play)
    return found


def other_seeds(env: Env, play: Rollout, count: int) -> list[int]:
    """Up to `count` of the env's validation seeds that are not the play's; fresh ones drawn
    from the OS where the env has none recorded (an env made outside `spade validate`)."""
    recorded = (env.meta.get("validation") or {}).get("seeds") or []
    seeds = [s for s in recorded if isinstance(s, int) and s != play.seed][:count]
    base = secrets.randbits(31)
    return seeds + [derive_seed("judge", base, play.id, i) for i in range(count - len(seeds))]


# A condemned env is blacklisted for the rest of the run, so a fair env may be judged wrongly at
# most this often a judgement (an env is judged in each round it is played and won).
FALSE_ALARM = 0.01
WIN_SHARE = re.compile(r"(\d+)/(\d+)")


def chance_of(env: Env) -> float:
    """The most a seed-blind player won at validation: the chance level or the best blind policy."""
    trivial = env.meta.get("trivial") or {}
    chance = trivial.get("chance")
    rates = [float(chance)] if isinstance(chance, (int, float)) and 0 <= chance <= 1 else []
    for share in (trivial.get("wins") or {}).values():
        if isinstance(share, str) and (match := WIN_SHARE.fullmatch(share)):
            won, played = map(int, match.groups())
            if 0 <= won <= played > 0:
                rates.append(won / played)
    return max(rates, default=0.0)


def transfers(wins: int, replays: int, chance: float) -> bool:
    """Whether `wins` of `replays` is beyond what the chance level gives: at least 2, and a
    binomial tail P(at least `wins` | replays, chance) under FALSE_ALARM."""
    tail = sum(math.comb(replays, k) * chance ** k * (1 - chance) ** (replays - k)
               for k in range(wins, replays + 1))
    return wins >= 2 and tail < FALSE_ALARM


def replay(task: Replay, pool: WorkerPool, cfg: Config) -> Replayed:
    """The play's actions on another seed, as a play: fresh worker, one reset, its pace."""
    started = time.monotonic()
    worker = pool.take()
    env_seconds = 0.0

    def call(op: str, **fields) -> Reply:
        nonlocal env_seconds
        left = cfg.env_budget - env_seconds
        if left <= 0:
            return Reply("env_budget")
        began = time.monotonic()
        reply = worker.call(op, within=left, **fields)
        env_seconds += time.monotonic() - began
        return reply

    try:
        win = False
        if call("load", source=task.env.source).ok and call("reset", seed=task.seed).ok:
            win = steps_win(task, call)
    finally:
        pool.retire(worker)
    return Replayed(win, time.monotonic() - started, env_seconds)


def steps_win(task: Replay, call) -> bool:
    waits = task.play.meta.get("waits") or []
    for index, turn in enumerate(task.play.turns):
        wait = waits[index] if index < len(waits) else 0.0
        if isinstance(wait, (int, float)) and wait > 0:
            time.sleep(wait)
        reply = call("step", action=turn.action)
        if not reply.ok:
            return False
        _, reward, terminated, truncated, _ = reply.result
        if terminated:
            return min(1.0, float(reward)) >= task.play.reward
        if truncated:
            return False
    return False


def judge(envs: Iterable[Env], plays: Iterable[Rollout], cfg: Config) -> list[Judgement]:
    """Replay every env's winners on other seeds; one judgement per env that had a winner."""
    by_id = {env.id: env for env in envs}
    found = {key: group for key, group in winners(plays, cfg).items() if key[0] in by_id}
    tasks = [Replay(by_id[env_id], play, seed) for (env_id, _), group in found.items()
             for play in group for seed in other_seeds(by_id[env_id], play, cfg.seeds)]
    if not tasks:
        return []
    with WorkerPool(cfg.sandbox, min(cfg.concurrency, len(tasks)), len(tasks)) as pool, \
            ThreadPoolExecutor(max_workers=min(cfg.concurrency, len(tasks))) as threads:
        results = list(threads.map(lambda task: replay(task, pool, cfg), tasks))
    outcomes: dict[tuple[str, bool], list[tuple[Replay, Replayed]]] = defaultdict(list)
    for task, result in zip(tasks, results):
        outcomes[(task.env.id, task.play.hint)].append((task, result))
    return [verdict(by_id[env_id], hinted, outcomes[(env_id, hinted)])
            for env_id, hinted in found]


def verdict(env: Env, hinted: bool, replays: list[tuple[Replay, Replayed]]) -> Judgement:
    wins = sum(result.won for _, result in replays)
    chance = chance_of(env)
    beyond = transfers(wins, len(replays), chance)
    plays = list(dict.fromkeys(task.play.id for task, _ in replays))
    return Judgement(
        env_id=env.id, hint=hinted, round=replays[0][0].play.round, plays=plays,
        replays=len(replays), wins=wins, chance=chance,
        verdict=("leak" if hinted else "shortcut") if beyond else "fair", parents=[env.id],
        meta={"seeds": [task.seed for task, _ in replays],
              "jail_seconds": round(sum(r.jail_seconds for _, r in replays), 3),
              "env_seconds": round(sum(r.env_seconds for _, r in replays), 3)})


def condemned(judgements: Iterable[Judgement], verdicts: tuple[str, ...] = ("shortcut",)
              ) -> set[str]:
    """The envs some judgement found to pay a seed-independent answer."""
    return {j.env_id for j in judgements if j.verdict in verdicts}


def jail_seconds(judgements: Iterable[Judgement], before: float = 0.0) -> float:
    """What judging cost in jail-seconds (worker lifetimes, waits included), added to `before`."""
    return round(before + sum(j.meta.get("jail_seconds", 0.0) for j in judgements), 3)
