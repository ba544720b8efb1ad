"""What judging the plays that happened costs: replays of winners vs the plays themselves.

What it measures, at the 4B games recipe's shape (24 envs a round, 8 no-hint plays an env;
16 hinted plays an env in a set's first round): every env is given winning plays (the worst
case: judging replays only envs with a winner), made of the env's own solution on one seed,
and `stages.judge.judge` replays 2 winners an env on 3 other seeds, each in a fresh jail with
one reset. Baseline in the same run: the same envs played by `stages.rollout.run` with an
instant scripted agent (8 plays an env, up to 10 turns each): the jail work the rollout stage
itself does. Both with no model wait between turns, so the numbers are the jails'
own cost (CPU); on a GPU box each replay also holds its jail (memory, no CPU) for as long as
the play waited for the model. The envs are the seed library's 16 (games and tool use),
cycled to 24. Interleaved passes, median.

    python benchmarks/judge.py            # 3 passes
    python benchmarks/judge.py --quick    # 1 pass

Prints wall seconds, jail-seconds and env-seconds per stage pass, replays, and the ratio of
judging to the rollout's own wall time. Exit 69 when nsjail cannot run here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import EX_UNAVAILABLE, ratio, table  # noqa: E402
from sandbox.jail import Sandbox, SandboxUnavailable, Worker  # noqa: E402
from stages import judge, rollout  # noqa: E402
from stages import seed_library  # noqa: E402
from stages.backends.scripted import ScriptedBackend  # noqa: E402
from stages.records import Rollout, Turn  # noqa: E402
from stages.shards import read  # noqa: E402

ENVS, PLAYS = 24, 8  # the 4B games recipe: batch 24, 8 no-hint plays an env
SEED = 7


def recipe_envs() -> list:
    shipped = list(read([str(seed_library.ENV_SHARD)], kinds={"env"}))
    return [shipped[i % len(shipped)] for i in range(ENVS)]


def solution(env) -> list[str]:
    with Worker(Sandbox()) as worker:
        worker.call("load", source=env.source)
        worker.call("reset", seed=SEED)
        return list(worker.call("solution").result)


def winning_plays(envs, solutions) -> list[Rollout]:
    return [Rollout(env_id=env.id, seed=SEED, reward=1.0, terminated=True, round=0,
                    turns=[Turn(action=a, reward=1.0) for a in solutions[env.id]],
                    meta={"play": p}) for env in envs for p in range(judge.Config().winners)]


def rollout_pass(envs) -> float:
    """The rollout stage's own jail work: 8 plays an env by an instant agent that sends one
    wrong move every turn, so each play runs its turns (10 at most)."""
    started = time.monotonic()
    agent = ScriptedBackend(lambda messages, tools: "\\boxed{zzz}")
    list(rollout.run(envs, agent, rollout.Config(plays=PLAYS, concurrency=8, max_turns=10)))
    return time.monotonic() - started


def judge_pass(envs, plays) -> tuple[float, list]:
    started = time.monotonic()
    judged = judge.judge(envs, plays, judge.Config(concurrency=8))
    return time.monotonic() - started, judged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    try:
        envs = recipe_envs()
        solutions = {env.id: solution(env) for env in envs}
    except SandboxUnavailable as exc:
        print(f"judge benchmark: nsjail cannot run here: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    plays = winning_plays(envs, solutions)
    walls, judges, judged = [], [], []
    for _ in range(1 if args.quick else 3):
        walls.append(rollout_pass(envs))
        seconds, judged = judge_pass(envs, plays)
        judges.append(seconds)
    wall, judging = statistics.median(walls), statistics.median(judges)
    jail = sum(j.meta["jail_seconds"] for j in judged)
    env_seconds = sum(j.meta["env_seconds"] for j in judged)
    replays = sum(j.replays for j in judged)
    print(table(f"judging the plays that happened: {ENVS} envs, every env with winners "
                f"(median of {len(walls)} passes, 8 jails at once)",
                ["pass", "wall s", "replays/plays", "jail-s", "env-s", "verdicts"],
                [["rollout (baseline: 8 plays an env)", wall, ENVS * PLAYS, "-", "-", "-"],
                 ["judge (2 winners x 3 seeds an env)", judging, replays, jail, env_seconds,
                  ", ".join(sorted({j.verdict for j in judged}))]]))
    per_env = jail / len(judged)
    print(f"judge/rollout wall: {ratio(judging, wall):.2f}x over {len(judged)} distinct envs; "
          f"{per_env:.2f} jail-s an env judged, so {per_env * ENVS:.0f} jail-s a round at the "
          f"4B shape ({ENVS} envs, all with winners) for the no-hint stage, twice that in a "
          f"set's first round (the hinted stage is judged too), plus each replay's model waits "
          f"(idle jails)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
