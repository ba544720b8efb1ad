"""Lineage queries: everything the registry knows upstream and downstream of one id.

In: an open registry and an id: an env (`env_...`), a design (`des_...`), an eval (`ev_...`)
or a checkpoint (its directory, absolute or relative, or its `step-NNNNNN` name when one run
has it). Out: a JSON-ready dict (`kind`, `id`, then sections). Guarantees: an id the registry
does not hold raises UnknownId (the CLI's usage error, exit 2); every lookup is an index seek,
so a query takes milliseconds whatever the registry's size.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import orjson

from stages.registry.schema import id_key


class UnknownId(LookupError):
    """An id the registry holds nothing for."""


def lineage(con: sqlite3.Connection, some_id: str) -> dict[str, Any]:
    kind, key = resolve(con, some_id)
    return {"env": env_lineage, "design": design_lineage, "checkpoint": checkpoint_lineage,
            "eval": eval_lineage}[kind](con, key)


def resolve(con: sqlite3.Connection, some_id: str) -> tuple[str, str]:
    """(kind, the registry's id) for what the user typed."""
    tables = {"env_": ("env", "SELECT id FROM envs WHERE id = ?"),
              "des_": ("design", "SELECT id FROM designs WHERE id = ?"),
              "ev_": ("eval", "SELECT id FROM evals WHERE id = ?")}
    for prefix, (kind, sql) in tables.items():
        if some_id.startswith(prefix) and con.execute(sql, (some_id,)).fetchone():
            return kind, some_id
    path = os.path.normpath(os.path.abspath(some_id))
    for sql, arg in (("SELECT id FROM checkpoints WHERE id = ?", some_id),
                     ("SELECT id FROM checkpoints WHERE id = ?", path),
                     ("SELECT id FROM checkpoints WHERE name = ?", os.path.basename(some_id))):
        found = con.execute(sql, (arg,)).fetchall()
        if len(found) == 1:
            return "checkpoint", found[0][0]
        if len(found) > 1:
            raise UnknownId(f"{some_id}: {len(found)} checkpoints have that name; give its "
                            "path")
    raise UnknownId(f"{some_id}: no env, design, checkpoint or eval with this id in the "
                    "registry")


def _rows(con: sqlite3.Connection, sql: str, args: tuple = ()) -> list[dict[str, Any]]:
    return [dict(row) for row in con.execute(sql, args)]


def _runs(con: sqlite3.Connection, table: str, column: str, value: str) -> list[str]:
    return [r[0] for r in con.execute(
        f"SELECT DISTINCT runs.name FROM {table} JOIN runs ON runs.id = {table}.run_id "
        f"WHERE {table}.{column} = ? ORDER BY runs.name", (value,))]


def _design(con: sqlite3.Connection, design_id: str) -> dict[str, Any] | None:
    row = con.execute("SELECT id, round, slot, attempt, domain, skill, difficulty, corpus_doc, "
                      "doc_title, prompt, completion_chars, memory_ids, policy FROM designs "
                      "WHERE id = ? LIMIT 1", (design_id,)).fetchone()
    if row is None:
        return None
    design = dict(row)
    design["memory_ids"] = orjson.loads(design["memory_ids"] or "[]")
    return design


def env_lineage(con: sqlite3.Connection, env_id: str) -> dict[str, Any]:
    env = dict(con.execute("SELECT id, source_hash, domain, skill, class_name, max_turns "
                           "FROM envs WHERE id = ?", (env_id,)).fetchone())
    records = _rows(con, "SELECT DISTINCT design_id, policy, hint, oracle, chance, validation, "
                         "shards.validator FROM env_records JOIN shards "
                         "ON shards.id = env_records.shard_id WHERE env_id = ?", (env_id,))
    design_ids = sorted({r["design_id"] for r in records if r["design_id"]})
    designs = [_design(con, d) or {"id": d, "indexed": False} for d in design_ids]
    validators: dict[str, set[str]] = {}  # a verdict -> the validators that gave it
    for r in records:
        if r["validation"]:
            validators.setdefault(r["validation"], set()).update(
                [r["validator"]] if r["validator"] else [])
    rejected = _rows(con, "SELECT DISTINCT validations.id, design_id, validations.round, "
                          "attempt, check_name, outcome, message, shards.validator "
                          "FROM validations JOIN shards ON shards.id = validations.shard_id "
                          "WHERE source_hash = ? ORDER BY validations.round, attempt",
                     (env["source_hash"],))
    trains = _trains_fed_by(con, env_id)
    checkpoints = sorted({t["policy"] for t in trains if t["policy"]})
    return {
        "kind": "env", "id": env_id, "env": env, "runs": _runs(con, "env_records", "env_id",
                                                                env_id),
        "designs": designs,
        "validation": [_accepted(env["domain"], orjson.loads(v), sorted(validators[v]))
                       for v in sorted(validators)] + [
            {"verdict": "rejected", **r} for r in rejected],
        "hints": sorted({r["hint"] for r in records if r["hint"]}),
        "plays": _play_groups(con, "env_id = ?", (env_id,)),
        "regrets": _rows(con, "SELECT DISTINCT regrets.id, regrets.round, regret, win, "
                              "solve_rate, plateau, designer_reward, designer_advantage, n_hint, "
                              "n_no_hint, broken, hint_leaks, at_chance, shards.reward "
                              "FROM regrets JOIN shards ON shards.id = regrets.shard_id "
                              "WHERE env_id = ? ORDER BY regrets.round", (env_id,)),
        "train_steps": trains,
        "checkpoints": [_checkpoint_summary(con, c) for c in checkpoints],
    }


def _accepted(domain: str, verdict: dict[str, Any], validators: list[str]) -> dict[str, Any]:
    """An accepted env's verdict: the contract checks it passed (sandbox/contract.py's order;
    the reset gate is tool use's only; an env without `solution()` has its oracle `none`), and
    the validators (stages/provenance.py digests) that gave it."""
    from sandbox.contract import CHECKS

    oracle = verdict.get("oracle", "solution")
    passed = [check for check in CHECKS if not (check == "reset_gate" and domain != "tool_use")
              and not (check == "oracle" and oracle == "none")]
    return {"verdict": "accepted", "checks_passed": passed, "oracle": oracle, **verdict,
            "validator": ",".join(validators) or None}


def _play_groups(con: sqlite3.Connection, where: str, args: tuple) -> list[dict[str, Any]]:
    """Plays aggregated per env, round, policy and hint (over every shard holding them)."""
    return _rows(con, f"""
        SELECT env_id, round, policy, hint, sum(n) AS plays, sum(n_ok) AS ok,
               sum(reward_sum) / sum(n) AS mean_reward, min(reward_min) AS min_reward,
               max(reward_max) AS max_reward, 1.0 * sum(n_win) / sum(n) AS win_rate
        FROM play_stats WHERE {where}
        GROUP BY env_id, round, policy, hint ORDER BY round, hint DESC, policy""", args)


def _trains_fed_by(con: sqlite3.Connection, env_id: str) -> list[dict[str, Any]]:
    """Train steps whose inputs include one of this env's plays (or its designs)."""
    return _rows(con, """
        SELECT trains.id, trains.round, trains.step, trains.role, trains.policy,
               trains.loss, count(DISTINCT plays.key) AS plays_of_this_env
        FROM plays JOIN train_inputs ON train_inputs.input_key = plays.key
                   JOIN trains ON trains.key = train_inputs.train_key
        WHERE plays.env_id = ?
        GROUP BY trains.id ORDER BY trains.round, trains.step""", (env_id,))


def _checkpoint_summary(con: sqlite3.Connection, ckpt: str) -> dict[str, Any]:
    row = con.execute("SELECT id, name, step, round, inputs, parent FROM checkpoints "
                      "WHERE id = ?", (ckpt,)).fetchone()
    summary = dict(row) if row else {"id": ckpt, "indexed": False}
    summary["evals"] = _evals_of(con, ckpt)
    return summary


def _evals_of(con: sqlite3.Connection, policy: str) -> list[dict[str, Any]]:
    """The roll-ups (no task) of a policy's evals: one line per suite and category."""
    return _rows(con, "SELECT DISTINCT id, suite, category, round, score, samples, ci_low, "
                      "ci_high FROM evals WHERE policy = ? AND task = '' "
                      "ORDER BY suite, category", (policy,))


def design_lineage(con: sqlite3.Connection, design_id: str) -> dict[str, Any]:
    envs = sorted({r[0] for r in con.execute(
        "SELECT env_id FROM env_records WHERE design_id = ?", (design_id,))})
    return {
        "kind": "design", "id": design_id, "design": _design(con, design_id),
        "runs": _runs(con, "designs", "id", design_id),
        "memory": [r[0] for r in con.execute(
            "SELECT DISTINCT parent FROM edges WHERE child = ?", (design_id,))],
        "rejected": _rows(con, "SELECT DISTINCT id, round, attempt, check_name, outcome, "
                               "message FROM validations WHERE design_id = ?", (design_id,)),
        "envs": [env_lineage(con, e) for e in envs],
        "regrets": _rows(con, "SELECT DISTINCT id, round, env_id, regret, designer_reward, "
                              "rejected_by FROM regrets WHERE design_id = ? ORDER BY round",
                         (design_id,)),
        "train_steps": _rows(con, """
            SELECT DISTINCT trains.id, trains.round, trains.step, trains.policy
            FROM train_inputs JOIN trains ON trains.key = train_inputs.train_key
            WHERE train_inputs.input_key = ? ORDER BY trains.round, trains.step""",
                             (id_key(design_id),)),
    }


def checkpoint_lineage(con: sqlite3.Connection, ckpt: str) -> dict[str, Any]:
    summary = _checkpoint_summary(con, ckpt)
    trains = _rows(con, "SELECT DISTINCT id, key, round, step, role, loss, n_inputs FROM trains "
                        "WHERE policy = ? ORDER BY step", (ckpt,))
    keys = tuple({t.pop("key") for t in trains})
    trained_on = _rows(con, f"""
        SELECT plays.env_id, plays.round, count(DISTINCT plays.key) AS plays
        FROM train_inputs JOIN plays ON plays.key = train_inputs.input_key
        WHERE train_inputs.train_key IN ({', '.join('?' * len(keys))})
        GROUP BY plays.env_id, plays.round ORDER BY plays.round, plays.env_id""", keys) \
        if keys else []
    designs = _rows(con, f"""
        SELECT DISTINCT designs.id, designs.round FROM train_inputs
        JOIN designs ON designs.key = train_inputs.input_key
        WHERE train_inputs.train_key IN ({', '.join('?' * len(keys))})""", keys) if keys else []
    children = [r[0] for r in con.execute("SELECT id FROM checkpoints WHERE parent = ?", (ckpt,))]
    return {"kind": "checkpoint", "id": ckpt, "checkpoint": summary,
            "runs": _runs(con, "checkpoints", "id", ckpt),
            "train_steps": trains, "trained_on_envs": trained_on, "trained_on_designs": designs,
            "rounds": sorted({r["round"] for r in trained_on}),
            "next_checkpoints": children,
            "plays_by_this_policy": _play_groups(con, "policy = ?", (ckpt,))}


def eval_lineage(con: sqlite3.Connection, eval_id: str) -> dict[str, Any]:
    row = dict(con.execute("SELECT id, suite, task, category, round, score, samples, ci_low, "
                           "ci_high, policy, ok FROM evals WHERE id = ? LIMIT 1",
                           (eval_id,)).fetchone())
    parents = [r[0] for r in con.execute("SELECT DISTINCT parent FROM edges WHERE child = ?",
                                         (eval_id,))]
    policy = row["policy"]
    ckpt = con.execute("SELECT 1 FROM checkpoints WHERE id = ?", (policy,)).fetchone() \
        if policy else None
    return {"kind": "eval", "id": eval_id, "eval": row, "parents": parents,
            "runs": _runs(con, "evals", "id", eval_id),
            "checkpoint": checkpoint_lineage(con, policy) if ckpt else
            ({"id": policy, "indexed": False} if policy else None)}
