"""Environment memory: recent envs with their win rate and regret, shown to the designer.

An entry's win rate is the share of its no-hint plays won (reward > 0, the reference's memory
win rate: `Regret.solve_rate`), not the mean reward the plateau scores (`Regret.win`).

In: env records (seeding), regret records (updates), memory records (the store).
Out: memory records (newest last, at most `cap`), and for one design prompt: positive examples
(same skill, win rate in the learnable band, highest regret) and one negative example (same
skill, too easy or too hard).
Guarantees: deterministic for a seed; the store never exceeds `cap`; a snippet is at most
`snippet_chars` of the env's source; negatives are named by class only. `copied_example` reads
the examples back out of a prompt `describe` wrote, and says which one a design copies. A run's
memory starts empty (the paper); seeding it from env shards (`spade memory seed`, a recipe's
`memory_seed`) stores them with win 0.5 and regret 0, so they serve as positives until real envs
replace them.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Iterable

from stages.records import Env, Memory, Regret

CAP = 200
SNIPPET_CHARS = 2000
# A design at least this share of whose code lines are lines of one example shown is a copy.
COPY_SHARE = 0.5


@dataclass(frozen=True)
class Selection:
    positive_band: tuple[float, float] = (0.15, 0.85)
    negative_low: float = 0.1
    negative_high: float = 0.9
    positives: int = 2
    negatives: int = 1


def entry(env: Env, win_rate: float = 0.5, regret: float = 0.0, round: int = -1) -> Memory:
    return Memory(env_id=env.id, skill=env.skill, snippet=env.source[:SNIPPET_CHARS],
                  win_rate=win_rate, regret=regret, round=round, parents=[env.id],
                  meta={"domain": env.domain, "class_name": env.class_name})


def seed(envs: Iterable[Env]) -> list[Memory]:
    return [entry(env) for env in envs]


def update(memory: list[Memory], envs: dict[str, Env], regrets: Iterable[Regret],
           cap: int = CAP) -> list[Memory]:
    """Add (or refresh) one entry per regret record; keep the newest `cap`."""
    by_env = {m.env_id: m for m in memory}
    for regret in regrets:
        env = envs.get(regret.env_id)
        if env is None:
            continue
        by_env.pop(regret.env_id, None)
        by_env[regret.env_id] = entry(env, regret.solve_rate, regret.regret, regret.round)
    return list(by_env.values())[-cap:]


def examples(memory: list[Memory], skill: str, rng: random.Random,
             selection: Selection = Selection()) -> tuple[list[Memory], list[Memory]]:
    """Positive and negative examples for one design prompt."""
    same = [m for m in memory if m.skill == skill]
    low, high = selection.positive_band
    # ties keep the memory's order (oldest first), as the reference's stable sort does
    learnable = sorted((m for m in same if low <= m.win_rate <= high), key=lambda m: -m.regret)
    pool = learnable[:max(3 * selection.positives, 10)]
    positives = rng.sample(pool, min(selection.positives, len(pool)))
    extreme = [m for m in same
               if m.win_rate > selection.negative_high or m.win_rate < selection.negative_low]
    negatives = rng.sample(extreme, min(selection.negatives, len(extreme)))
    return positives, negatives


def describe(positives: list[Memory], negatives: list[Memory]) -> tuple[str, str]:
    """The two text blocks the designer prompt shows."""
    good = "".join(f"\n### Example {i} (skill: {m.skill}, win rate: {m.win_rate:.2f}, "
                   f"regret: {m.regret:.2f})\n```python\n{m.snippet}\n```\n"
                   for i, m in enumerate(positives, 1))
    bad = "".join(f"\n- {'too easy' if m.win_rate > 0.5 else 'too hard'} (win rate "
                  f"{m.win_rate:.2f}): class {m.meta.get('class_name') or m.env_id}"
                  for m in negatives)
    if bad:  # by class name only, as the reference does: no code to copy from a failure
        bad = "\nAvoid environments like:" + bad + "\n"
    if good:
        good = ("These worked well: the agent won some plays and the hint helped. Learn from "
                "how they are built and how hard they are, then design a new game of your own: "
                "not one of these again with other names or numbers." + good)
    return good, bad


SHOWN_EXAMPLE = re.compile(r"^### Example (\d+) \(skill: [^\n]*\n```python\n(.*?)\n```$",
                           re.S | re.M)


def copied_example(source: str, prompt: str) -> tuple[int, int, int] | None:
    """(example number, lines shared, lines of the module) for the example of the prompt (as
    `describe` wrote it) that a module mostly repeats, else None. Lines are compared stripped,
    blank ones left out: the copy of an example under other names or numbers still shares
    most of its lines, a new design shares its imports and a few signatures."""
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    for found in SHOWN_EXAMPLE.finditer(prompt):
        shown = {line.strip() for line in found.group(2).splitlines() if line.strip()}
        shared = sum(line in shown for line in lines)
        if lines and shared >= COPY_SHARE * len(lines):
            return int(found.group(1)), shared, len(lines)
    return None
