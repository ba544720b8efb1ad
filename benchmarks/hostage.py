"""Hostage benchmark: what one env that stalls on the agent's actions costs a rollout stage.

What it measures: `stages.rollout.run` over 10 seed-library envs, 8 plays each at concurrency 8
(the defaults) and 5 turns, three ways, each timed in the same run:
  without     the 10 envs alone (the baseline);
  unbounded   plus one hostage env: instant on its own solution's actions (all a validator
              needs), 9.5 s a step (just under the 10 s turn deadline) on anything else; no env
              budget and no blacklist, as spade ran before issue 17;
  bounded     the same 11 envs with the defaults: 10 s of env time per play, an env blacklisted
              after one play that ran out the clock.
Two agents: `instant` (the scripted policy of benchmarks/rollout.py, no model time: the worst
case, where the stage is nothing but env time) and `engine` (the same policy behind an engine
whose completions take 0.5 ms a token, lengths lognormal around 600 tokens, as
benchmarks/rollout.py's barrier section: the model dominates, as on a GPU box). The unbounded
row runs with the instant agent only (its cost is env time). Ratio = stage seconds / without.

How to run:
  python benchmarks/hostage.py            # about 2 minutes on 2 cores
  python benchmarks/hostage.py --json out.json

Target: bounded / without <= 1.5 with the engine agent. The bound by design is one env budget
per hostage env per env set (its first plays run out the clock together, the rest are skipped);
with the instant agent the baseline is a few seconds, so that budget is the whole ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import exit_69_when_unavailable, finish, ratio, table  # noqa: E402
from benchmarks.rollout import SECONDS_PER_TOKEN, completion_tokens, respond  # noqa: E402
from stages import rollout  # noqa: E402
from stages.backends import Sampling  # noqa: E402
from stages.backends.scripted import ScriptedBackend  # noqa: E402
from stages.records import Env  # noqa: E402
from stages.shards import read  # noqa: E402
from stages.validate import source_hash  # noqa: E402

ENV_SHARD = Path(__file__).resolve().parent.parent / "stages" / "seed_library" / "envs.jsonl"
TARGET = 1.5
TURNS = 5
HOSTAGE = '''
import random
import re
import time


class VaultEnv:
    max_turns = 25

    def reset(self, seed=None):
        self.code = random.Random(seed).randint(100, 999)
        return "Open the vault: reply \\\\boxed{open CODE} with its three-digit code.", {}

    def step(self, action):
        if action != self.solution()[0]:
            time.sleep(9.5)  # just under the turn deadline: never a timeout, always a stall
            return "Nothing happens.", 0.0, False, False, {}
        return "Open.", 1.0, True, False, {}

    def solution(self):
        return [f"\\\\boxed{{open {self.code}}}"]
'''


def hostage() -> Env:
    return Env(domain="game", class_name="VaultEnv", source=HOSTAGE,
               source_hash=source_hash(HOSTAGE), max_turns=25)


def agent(kind: str) -> ScriptedBackend:
    if kind == "instant":
        return ScriptedBackend(respond, policy="bench-scripted")

    def latency(sampling: Sampling) -> float:
        return completion_tokens(sampling) * SECONDS_PER_TOKEN

    return ScriptedBackend(respond, policy="bench-engine", latency=latency)


def stage_pass(envs: list[Env], cfg: rollout.Config, kind: str) -> dict[str, Any]:
    started = time.perf_counter()
    plays = list(rollout.run(envs, agent(kind), cfg))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "plays": len(plays),
            "outcomes": dict(Counter(p.outcome for p in plays))}


def measure() -> dict[str, Any]:
    normal = list(read([str(ENV_SHARD)], kinds={"env"}))[:10]
    bounded = rollout.Config(max_turns=TURNS)
    unbounded = replace(bounded, env_budget=float("inf"), blacklist_after=sys.maxsize)
    runs = {}
    for kind in ("instant", "engine"):
        runs[f"{kind}/without"] = stage_pass(normal, bounded, kind)
        if kind == "instant":
            runs[f"{kind}/unbounded"] = stage_pass(normal + [hostage()], unbounded, kind)
        runs[f"{kind}/bounded"] = stage_pass(normal + [hostage()], bounded, kind)
    return {"runs": runs}


def rows(results: dict[str, Any]) -> list[list[Any]]:
    runs = results["runs"]
    out = []
    for name, run in runs.items():
        base = runs[name.split("/")[0] + "/without"]["seconds"]
        hostage_outcomes = ", ".join(f"{k} {v}" for k, v in sorted(run["outcomes"].items())
                                     if k != "ok") or "-"
        out.append([name, run["plays"], run["seconds"], ratio(run["seconds"], base),
                    hostage_outcomes])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)

    def body() -> int:
        results = measure()
        print(table(f"rollout stage with one hostage env (10 seed envs x 8 plays, "
                    f"{TURNS} turns, concurrency 8)",
                    ["agent/envs", "plays", "seconds", "x without", "not ok"], rows(results)))
        runs = results["runs"]
        engine = ratio(runs["engine/bounded"]["seconds"], runs["engine/without"]["seconds"])
        instant = ratio(runs["instant/bounded"]["seconds"], runs["instant/without"]["seconds"])
        saved = ratio(runs["instant/unbounded"]["seconds"], runs["instant/bounded"]["seconds"])
        return finish(results, [
            (f"engine agent: bounded <= {TARGET}x without", engine <= TARGET, f"{engine:.2f}x"),
            ("instant agent: bounded vs unbounded", saved > 1, f"{saved:.1f}x faster, "
             f"{instant:.1f}x without (one env budget over a {runs['instant/without']['seconds']:.1f} s stage)"),
        ], args.json)

    return exit_69_when_unavailable("hostage", body)


if __name__ == "__main__":
    sys.exit(main())
