"""The registry's SQLite schema, connection settings and the small helpers every part shares.

In: a database path. Out: an open sqlite3 connection (WAL journal, foreign keys off, the schema
created if missing). Guarantees: every row that comes from a shard carries that shard's
`shard_id`, so a shard that changed on disk is re-indexed by deleting its rows and adding them
again; ids that appear by the million (plays, train inputs) are stored as 64-bit integer keys
(`id_key`), the rest as the records' own text ids.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

SCHEMA_VERSION = 2  # 2: the shards' provenance (stages/provenance.py)
DEFAULT_DB = "spade-registry.db"
DB_ENV = "SPADE_REGISTRY"

TABLES = """
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs(id INTEGER PRIMARY KEY, path TEXT UNIQUE, name TEXT);
CREATE TABLE IF NOT EXISTS shards(
  id INTEGER PRIMARY KEY, run_id INT, path TEXT UNIQUE, stage TEXT, kind TEXT, round INT,
  size INT, mtime_ns INT, digest TEXT, records INT, spade_version TEXT, validator TEXT,
  reward TEXT);
CREATE TABLE IF NOT EXISTS designs(
  id TEXT, key INTEGER, shard_id INT, run_id INT, round INT, slot INT, attempt INT, domain TEXT,
  skill TEXT, difficulty TEXT, corpus_doc TEXT, doc_title TEXT, prompt TEXT, completion_chars INT,
  memory_ids TEXT, policy TEXT, ok INT, PRIMARY KEY(id, shard_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS envs(
  id TEXT PRIMARY KEY, source_hash TEXT, domain TEXT, skill TEXT, class_name TEXT,
  max_turns INT, tools TEXT, source TEXT);
CREATE TABLE IF NOT EXISTS env_records(
  env_id TEXT, shard_id INT, run_id INT, design_id TEXT, policy TEXT, hint TEXT, oracle TEXT,
  chance REAL, validation TEXT, PRIMARY KEY(env_id, shard_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS validations(
  id TEXT, shard_id INT, run_id INT, design_id TEXT, round INT, slot INT, attempt INT,
  domain TEXT, skill TEXT, check_name TEXT, outcome TEXT, message TEXT, source_hash TEXT,
  policy TEXT, PRIMARY KEY(id, shard_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS plays(
  key INTEGER, shard_id INT, env_id TEXT, round INT, PRIMARY KEY(key, shard_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS play_stats(
  shard_id INT, run_id INT, env_id TEXT, round INT, policy TEXT, hint INT, n INT, n_ok INT,
  n_win INT, reward_sum REAL, reward_min REAL, reward_max REAL, turns INT);
CREATE TABLE IF NOT EXISTS regrets(
  id TEXT, shard_id INT, run_id INT, env_id TEXT, design_id TEXT, skill TEXT, round INT,
  variant TEXT, regret REAL, regret_n REAL, win REAL, solve_rate REAL, plateau REAL,
  designer_reward REAL, designer_advantage REAL, hint_reward REAL, no_hint_reward REAL,
  n_hint INT, n_no_hint INT, broken INT, hint_leaks INT, at_chance INT, rejected_by TEXT,
  PRIMARY KEY(id, shard_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trains(
  id TEXT, key INTEGER, shard_id INT, run_id INT, round INT, step INT, role TEXT, policy TEXT,
  loss REAL, stats TEXT, n_inputs INT, PRIMARY KEY(id, shard_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS train_inputs(train_key INTEGER, input_key INTEGER, shard_id INT);
CREATE TABLE IF NOT EXISTS checkpoints(
  id TEXT PRIMARY KEY, shard_id INT, run_id INT, name TEXT, step INT, round INT, inputs TEXT,
  parent TEXT, n_train INT);
CREATE TABLE IF NOT EXISTS evals(
  id TEXT, shard_id INT, run_id INT, suite TEXT, task TEXT, category TEXT, round INT,
  score REAL, samples INT, ci_low REAL, ci_high REAL, policy TEXT, ok INT,
  PRIMARY KEY(id, shard_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS edges(child TEXT, parent TEXT, shard_id INT);
"""

# Each lookup the lineage and export queries make is an index seek, never a scan.
INDEXES = """
CREATE INDEX IF NOT EXISTS designs_id ON designs(id);
CREATE INDEX IF NOT EXISTS designs_key ON designs(key);
CREATE INDEX IF NOT EXISTS designs_shard ON designs(shard_id);
CREATE INDEX IF NOT EXISTS env_records_shard ON env_records(shard_id);
CREATE INDEX IF NOT EXISTS env_records_design ON env_records(design_id);
CREATE INDEX IF NOT EXISTS validations_design ON validations(design_id);
CREATE INDEX IF NOT EXISTS validations_source ON validations(source_hash);
CREATE INDEX IF NOT EXISTS validations_shard ON validations(shard_id);
CREATE INDEX IF NOT EXISTS plays_env ON plays(env_id);
CREATE INDEX IF NOT EXISTS plays_shard ON plays(shard_id);
CREATE INDEX IF NOT EXISTS play_stats_env ON play_stats(env_id);
CREATE INDEX IF NOT EXISTS play_stats_policy ON play_stats(policy);
CREATE INDEX IF NOT EXISTS play_stats_shard ON play_stats(shard_id);
CREATE INDEX IF NOT EXISTS regrets_env ON regrets(env_id);
CREATE INDEX IF NOT EXISTS regrets_design ON regrets(design_id);
CREATE INDEX IF NOT EXISTS regrets_shard ON regrets(shard_id);
CREATE INDEX IF NOT EXISTS trains_key ON trains(key);
CREATE INDEX IF NOT EXISTS trains_policy ON trains(policy);
CREATE INDEX IF NOT EXISTS trains_shard ON trains(shard_id);
CREATE INDEX IF NOT EXISTS train_inputs_input ON train_inputs(input_key);
CREATE INDEX IF NOT EXISTS train_inputs_train ON train_inputs(train_key);
CREATE INDEX IF NOT EXISTS train_inputs_shard ON train_inputs(shard_id);
CREATE INDEX IF NOT EXISTS checkpoints_name ON checkpoints(name);
CREATE INDEX IF NOT EXISTS evals_id ON evals(id);
CREATE INDEX IF NOT EXISTS evals_policy ON evals(policy);
CREATE INDEX IF NOT EXISTS evals_shard ON evals(shard_id);
CREATE INDEX IF NOT EXISTS edges_child ON edges(child);
CREATE INDEX IF NOT EXISTS edges_parent ON edges(parent);
CREATE INDEX IF NOT EXISTS edges_shard ON edges(shard_id);
"""

# Tables whose rows belong to one shard: what re-indexing a changed shard deletes first.
# A shard's provenance columns: the stamp of the manifest entry that lists it.
PROVENANCE = ("spade_version", "validator", "reward")

SHARD_TABLES = ("designs", "env_records", "validations", "plays", "play_stats", "regrets",
                "trains", "train_inputs", "checkpoints", "evals", "edges")


def default_db() -> str:
    """$SPADE_REGISTRY when set, else ./spade-registry.db."""
    return os.environ.get(DB_ENV) or DEFAULT_DB


def connect(path: str | Path, create: bool = True) -> sqlite3.Connection:
    """Open (and with `create`, make) the registry; WAL lets readers query while it indexes."""
    if not create and not Path(path).exists():
        from stages.shards import InputMissing

        raise InputMissing(f"{path}: no registry here (run `spade registry index RUN_DIR` "
                           "first, or pass --db)")
    con = sqlite3.connect(str(path), isolation_level=None)  # transactions are explicit
    con.row_factory = sqlite3.Row
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")  # WAL keeps a committed shard across a crash
    con.execute("PRAGMA busy_timeout=10000")
    if create:
        con.executescript(TABLES + INDEXES)
        con.execute("INSERT OR IGNORE INTO info VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        _upgrade(con)
    return con


def _upgrade(con: sqlite3.Connection) -> None:
    """A version-1 registry gains the provenance columns; its shards are read again by the
    next index (their mtime is forgotten), which fills them in without changing any row."""
    def version() -> int:
        return int(con.execute("SELECT value FROM info WHERE key = 'schema'").fetchone()[0])

    if version() >= SCHEMA_VERSION:
        return
    con.execute("BEGIN IMMEDIATE")
    if version() >= SCHEMA_VERSION:  # another index upgraded it first
        con.execute("COMMIT")
        return
    for column in PROVENANCE:
        con.execute(f"ALTER TABLE shards ADD COLUMN {column} TEXT")
    con.execute("UPDATE shards SET mtime_ns = -1")
    con.execute("UPDATE info SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))
    con.execute("COMMIT")


def id_key(record_id: str) -> int:
    """A signed 64-bit key for an id: its 16 hex digits when it has them, else a hash of it."""
    _, _, tail = record_id.partition("_")
    try:
        value = int(tail, 16) if len(tail) == 16 else None
    except ValueError:
        value = None
    if value is None:
        value = int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:8], "big")
    return value - (1 << 64) if value >= 1 << 63 else value


def content_digest(con: sqlite3.Connection) -> str:
    """A digest of every table's rows in a fixed order: equal digests, equal registries."""
    sha = hashlib.sha256()
    for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                "ORDER BY name").fetchall():
        sha.update(table.encode())
        width = len(con.execute(f"PRAGMA table_info({table})").fetchall())
        order = ", ".join(str(i) for i in range(1, width + 1))
        for row in con.execute(f"SELECT * FROM {table} ORDER BY {order}"):
            sha.update(repr(tuple(row)).encode())
    return sha.hexdigest()


def row_counts(con: sqlite3.Connection) -> dict[str, int]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                       "ORDER BY name")]
    return {name: con.execute(f"SELECT count(*) FROM {name}").fetchone()[0] for name in names}
