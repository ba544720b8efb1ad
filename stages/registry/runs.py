"""Which code judged and scored each indexed run, and where that changed between runs.

In: an open registry. Out: one dict per run, in the order the runs were first indexed: its
name and path, the spade versions that wrote it, the validator digests of its validate
shards and the reward digests of its score-regret shards (stages/provenance.py), what of
these differs from the run before it (`changed`), and which of them changed within the run
itself (`mixed`: a run resumed under other code, or with other settings).
Guarantees: only stamps a manifest gave are compared; a run whose shards predate the stamps
(NULL) is compared on what it has, so "unknown" never reads as "changed".
"""

from __future__ import annotations

import sqlite3
from typing import Any

from stages.registry.schema import PROVENANCE

PLURAL = {"spade_version": "spade_versions", "validator": "validators", "reward": "rewards"}


def run_provenance(con: sqlite3.Connection) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    before: dict[str, set[str]] = {}
    for run in con.execute("SELECT id, name, path FROM runs ORDER BY id").fetchall():
        stamps = {column: _distinct(con, run["id"], column) for column in PROVENANCE}
        changed = [column for column in PROVENANCE
                   if stamps[column] and before.get(column) and stamps[column] != before[column]]
        found.append({"run": run["name"], "path": run["path"],
                      **{PLURAL[column]: sorted(stamps[column]) for column in PROVENANCE},
                      "changed": changed,
                      "mixed": [column for column in PROVENANCE if len(stamps[column]) > 1]})
        before = {column: values or before.get(column, set())
                  for column, values in stamps.items()}
    return found


def _distinct(con: sqlite3.Connection, run_id: int, column: str) -> set[str]:
    return {row[0] for row in con.execute(
        f"SELECT DISTINCT {column} FROM shards WHERE run_id = ? AND {column} IS NOT NULL",
        (run_id,))}
