"""Export accepted envs from the registry as env records any stage can play.

In: an open registry and filters (least mean regret, skill, domain, the rounds an env first
came from, how many: the first N or a seeded sample of N).
Out: `Env` records, one per program (the registry keys envs by their program hash), each with
its latest hint, the designs it came from as `parents`, and what the registry knows of it in
`meta.registry`: runs, rounds played, mean regret, win rates hinted and not, plays.
Guarantees: only envs some run accepted (an env record, never a reject); each program once;
an env's round is the earliest `r<NN>` holding one of its env records (records outside a
round directory, such as an export, do not count); ordered by mean regret (highest first),
then id, so an export is reproducible; a sample is the N envs with the smallest sha256 of
`seed:id`, so the same registry contents and seed give the same sample whatever order their
rows were indexed in.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Iterator

import orjson

from stages.records import Env, seeded_sample


@dataclass(frozen=True)
class Filters:
    min_regret: float | None = None
    skill: str | None = None
    domain: str | None = None
    limit: int | None = None
    rounds: tuple[int, int] | None = None  # first round from, to (both included)
    sample: int | None = None  # N envs drawn by `seed` instead of the first `limit`
    seed: int = 0

    def __post_init__(self) -> None:
        if self.limit is not None and self.sample is not None:
            raise ValueError("--limit and --sample: give one (the first N, or N drawn by --seed)")


def parse_rounds(text: str) -> tuple[int, int]:
    """`A-B` or `N` as (first, last), both included; ValueError saying what fits."""
    first, dash, last = text.strip().partition("-")
    try:
        bounds = (int(first), int(last) if dash else int(first))
    except ValueError:
        raise ValueError(f"--rounds {text!r}: expected N or A-B (round numbers from 0)") from None
    if bounds[0] < 0 or bounds[1] < bounds[0]:
        raise ValueError(f"--rounds {text!r}: expected A-B with 0 <= A <= B")
    return bounds


def export_envs(con: sqlite3.Connection, filters: Filters) -> Iterator[Env]:
    rows = _chosen(con, filters)
    if filters.sample is not None:
        rows = seeded_sample(rows, filters.sample, filters.seed, lambda row: row["id"])
    for row in rows:
        yield _env_record(con, row)


def _chosen(con: sqlite3.Connection, filters: Filters) -> list[sqlite3.Row]:
    where, args = ["EXISTS (SELECT 1 FROM env_records WHERE env_records.env_id = envs.id)"], []
    if filters.skill is not None:
        where.append("envs.skill = ?")
        args.append(filters.skill)
    if filters.domain is not None:
        where.append("envs.domain = ?")
        args.append(filters.domain)
    if filters.rounds is not None:
        # the round of the earliest round directory holding one of the env's records
        where.append("(SELECT min(shards.round) FROM env_records AS first JOIN shards ON "
                     "shards.id = first.shard_id WHERE first.env_id = envs.id) BETWEEN ? AND ?")
        args.extend(filters.rounds)
    chosen = ""
    if filters.min_regret is not None:
        chosen = "WHERE mean_regret IS NOT NULL AND mean_regret >= ?"
        args.append(filters.min_regret)
    limit = f"LIMIT {int(filters.limit)}" if filters.limit is not None else ""
    # one regret row per id (a row indexed from two shards counts once)
    return con.execute(f"""
        SELECT * FROM (
          SELECT envs.*, (SELECT avg(regret) FROM (SELECT DISTINCT id, regret FROM regrets
                          WHERE regrets.env_id = envs.id)) AS mean_regret
          FROM envs WHERE {' AND '.join(where)})
        {chosen} ORDER BY mean_regret IS NULL, mean_regret DESC, id {limit}""",
                       args).fetchall()


def _env_record(con: sqlite3.Connection, row: sqlite3.Row) -> Env:
    env_id = row["id"]
    hint = con.execute("SELECT hint FROM env_records WHERE env_id = ? AND hint IS NOT NULL "
                       "ORDER BY shard_id DESC LIMIT 1", (env_id,)).fetchone()
    designs = [r[0] for r in con.execute(
        "SELECT DISTINCT design_id FROM env_records WHERE env_id = ? AND design_id IS NOT NULL "
        "ORDER BY design_id", (env_id,))]
    return Env(domain=row["domain"], skill=row["skill"], class_name=row["class_name"],
               source=row["source"], source_hash=row["source_hash"],
               max_turns=row["max_turns"], tools=orjson.loads(row["tools"] or "[]"),
               hint=hint[0] if hint else None, parents=designs,
               meta={"registry": _statistics(con, env_id, row["mean_regret"])})


def _statistics(con: sqlite3.Connection, env_id: str, mean_regret: float | None) -> dict[str, Any]:
    plays = {hint: (n, wins, total) for hint, n, wins, total in con.execute(
        "SELECT hint, sum(n), sum(n_win), sum(reward_sum) FROM play_stats WHERE env_id = ? "
        "GROUP BY hint", (env_id,))}
    rounds = [r[0] for r in con.execute(
        "SELECT DISTINCT round FROM play_stats WHERE env_id = ? ORDER BY round", (env_id,))]
    runs = [r[0] for r in con.execute(
        "SELECT DISTINCT runs.name FROM env_records JOIN runs ON runs.id = env_records.run_id "
        "WHERE env_id = ? ORDER BY runs.name", (env_id,))]

    def rate(hint: int, part: int) -> float | None:
        n = plays.get(hint, (0, 0, 0.0))[0]
        return round(plays[hint][part] / n, 6) if n else None

    return {"runs": runs, "rounds": rounds, "rounds_seen": len(rounds),
            "mean_regret": None if mean_regret is None else round(mean_regret, 6),
            "win_rate": rate(0, 1), "hint_win_rate": rate(1, 1),
            "mean_reward": rate(0, 2), "hint_mean_reward": rate(1, 2),
            "plays": plays.get(0, (0,))[0], "hint_plays": plays.get(1, (0,))[0]}
