"""Index run directories into the registry, incrementally and idempotently.

In: run directories (`runs/<name>/`, as `spade run` writes them) and an open registry.
Out: rows in the registry's tables (stages/registry/schema.py) and an IndexReport.
Guarantees:
- a shard file is read only once it is complete: its directory's `_manifest.json` lists it
  among a finished input shard's outputs with the number of lines it holds (stages/shards.py
  writes each output atomically and only then the manifest naming it). Anything else, a stage
  still writing or a file the manifest does not (yet) name, is skipped and counted `pending`,
  and picked up by a later `index`;
- one transaction per shard: a reader (or a kill) never sees half a shard;
- re-indexing is a no-op: a shard whose size and mtime are those recorded is not read again,
  and one whose bytes hash to the recorded digest changes nothing; a shard whose content
  changed has its rows replaced;
- memory is bounded by one shard: plays are aggregated per (env, round, policy, hint) as they
  are read, and only their ids (as integer keys, for the train-step edges) are kept.
Lines are decoded with orjson and read field by field, without the pydantic models: the
shards were validated when they were written, and the registry must read millions of plays
in minutes. A line that is not JSON, or written by a newer spade, is a RecordError. Envs and
designs, the kinds whose id names their content, are the exception: each is checked exactly
as every reader checks it (stages.records.parse), so an env whose id is not its program's
(`path:line: id does not match its content`) stops the index (RecordError, exit 65) before
its shard is stored, and `lineage` and `export` never see it.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson

from stages.records import MODELS, VERSION, RecordError, parse
from stages.registry.schema import PROVENANCE, SHARD_TABLES, id_key
from stages.shards import MANIFEST, SUFFIXES, InputMissing, max_line_bytes, open_text

KINDS = ("design", "env", "validation", "rollout", "regret", "train", "eval")
ROUND_DIR = re.compile(r"r(\d+)$")
STATE_FILE = "trainer_state.json"

# Columns each table is filled with, after the owning shard's id (and run id where it has one).
COLUMNS: dict[str, tuple[str, ...]] = {
    "designs": ("id", "key", "round", "slot", "attempt", "domain", "skill", "difficulty",
                "corpus_doc", "doc_title", "prompt", "completion_chars", "memory_ids", "policy",
                "ok"),
    "env_records": ("env_id", "design_id", "policy", "hint", "oracle", "chance", "validation"),
    "validations": ("id", "design_id", "round", "slot", "attempt", "domain", "skill",
                    "check_name", "outcome", "message", "source_hash", "policy"),
    "plays": ("key", "env_id", "round"),
    "play_stats": ("env_id", "round", "policy", "hint", "n", "n_ok", "n_win", "reward_sum",
                   "reward_min", "reward_max", "turns"),
    "regrets": ("id", "env_id", "design_id", "skill", "round", "variant", "regret", "regret_n",
                "win", "solve_rate", "plateau", "designer_reward", "designer_advantage",
                "hint_reward", "no_hint_reward", "n_hint", "n_no_hint", "broken", "hint_leaks",
                "at_chance", "rejected_by"),
    "trains": ("id", "key", "round", "step", "role", "policy", "loss", "stats", "n_inputs"),
    "train_inputs": ("train_key", "input_key"),
    "checkpoints": ("id", "name", "step", "round", "inputs", "parent", "n_train"),
    "evals": ("id", "suite", "task", "category", "round", "score", "samples", "ci_low",
              "ci_high", "policy", "ok"),
    "edges": ("child", "parent"),
}
WITHOUT_RUN = {"plays", "train_inputs", "edges"}
ENV_COLUMNS = ("id", "source_hash", "domain", "skill", "class_name", "max_turns", "tools",
               "source")


@dataclass
class IndexReport:
    """What one `index` call did: shards read, left as they were, or not complete yet."""

    indexed: int = 0
    unchanged: int = 0
    pending: int = 0
    records: Counter = field(default_factory=Counter)
    pending_paths: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"indexed": self.indexed, "unchanged": self.unchanged, "pending": self.pending,
                "records": dict(self.records)}


@dataclass(frozen=True)
class RunDir:
    """A run directory, and where the relative paths its records name (policies) point."""

    path: Path
    name: str
    base: Path
    # policy as written -> as the registry names it: a run names few policies, millions of times
    known: dict[str, str | None] = field(default_factory=dict, compare=False, hash=False,
                                          repr=False)

    @classmethod
    def of(cls, path: str | Path) -> "RunDir":
        root = Path(path).resolve()
        if not root.is_dir():
            raise InputMissing(f"{path}: no such run directory")
        name, base = root.name, Path.cwd()
        recipe = root / "recipe.json"
        if recipe.exists():
            resolved = orjson.loads(recipe.read_bytes())
            name = resolved.get("name") or name
            # `spade run` names paths relative to where it ran: run_dir's parent chain
            parts = Path(resolved.get("run_dir", "")).parts
            if parts and not Path(*parts).is_absolute() and root.parts[-len(parts):] == parts:
                base = Path(*root.parts[:-len(parts)])
        return cls(root, name, base)

    def policy(self, value: str | None) -> str | None:
        """A policy as the registry names it: a checkpoint or model dir as a normal absolute
        path (so a train record's and a rollout's name for one checkpoint agree), else as is."""
        if value not in self.known:
            self.known[value] = self._resolve(value)
        return self.known[value]

    def _resolve(self, value: str | None) -> str | None:
        if not value or "/" not in value or "://" in value:
            return value
        path = Path(os.path.normpath(self.base / value))
        if not path.exists() and "ckpt/step-" in value:  # a run dir moved since it ran
            moved = self.path / "ckpt" / Path(value).name
            path = moved if moved.exists() else path
        return str(path)


@dataclass(frozen=True)
class ShardFile:
    """A shard file a manifest lists as complete, with the line count it gives."""

    path: Path
    kind: str
    stage: str
    round: int | None
    expected: int | None  # None: a checkpoint's trainer_state.json
    provenance: dict[str, Any] = field(default_factory=dict)  # its manifest entry's


def index_runs(con: sqlite3.Connection, run_dirs: list[str]) -> IndexReport:
    report = IndexReport()
    for run_dir in run_dirs:
        run = RunDir.of(run_dir)
        run_id = _run_id(con, run)
        files, pending = discover(run)
        report.pending += len(pending)
        report.pending_paths.extend(str(p) for p in pending)
        for shard in files:
            index_shard(con, run, run_id, shard, report)
    return report


def _run_id(con: sqlite3.Connection, run: RunDir) -> int:
    con.execute("INSERT OR IGNORE INTO runs(path, name) VALUES (?, ?)", (str(run.path), run.name))
    return con.execute("SELECT id FROM runs WHERE path = ?", (str(run.path),)).fetchone()[0]


def discover(run: RunDir) -> tuple[list[ShardFile], list[Path]]:
    """(complete shard files in path order, shard files not complete yet)."""
    found: list[ShardFile] = []
    pending: list[Path] = []
    for folder, dirs, names in os.walk(run.path):
        dirs[:] = sorted(d for d in dirs if not d.endswith(".tmp") and d != "ckpt")
        here = Path(folder)
        shard_names = {n for n in names if n.endswith(SUFFIXES) and n.split("-", 1)[0] in KINDS
                       and not n.startswith((".", "_"))}
        listed = _listed(here / MANIFEST) if MANIFEST in names else {}
        round_ = _round_of(here.relative_to(run.path))
        for name in sorted(shard_names):
            if name in listed:
                count, provenance = listed[name]
                found.append(ShardFile(here / name, name.split("-", 1)[0], here.name, round_,
                                       count, provenance))
            else:
                pending.append(here / name)
    found.extend(_checkpoint_states(run))
    return found, pending


def _listed(manifest: Path) -> dict[str, tuple[int, dict[str, Any]]]:
    """Output file -> (line count, provenance), for every finished input shard the manifest
    names. A manifest older than provenance stamps gives its top-level spade version."""
    try:
        data = orjson.loads(manifest.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}  # being replaced right now: the next index reads it
    listed: dict[str, tuple[int, dict[str, Any]]] = {}
    version = {"spade_version": data.get("spade_version")}
    for entry in (data.get("shards") or {}).values():
        provenance = entry.get("provenance") or version
        for name, count in (entry.get("outputs") or {}).items():
            listed[name] = (count, provenance)
    return listed


def _round_of(relative: Path) -> int | None:
    for part in relative.parts:
        match = ROUND_DIR.match(part)
        if match:
            return int(match.group(1))
    return None


def _checkpoint_states(run: RunDir) -> Iterator[ShardFile]:
    # A step dir exists only complete (written as step-N.tmp, then renamed)
    for state in sorted((run.path / "ckpt").glob(f"step-*/{STATE_FILE}")):
        if not state.parent.name.endswith(".tmp"):
            yield ShardFile(state, "checkpoint", "ckpt", None, None)


def index_shard(con: sqlite3.Connection, run: RunDir, run_id: int, shard: ShardFile,
                report: IndexReport) -> None:
    stat = shard.path.stat()
    known = con.execute("SELECT id, size, mtime_ns, digest FROM shards WHERE path = ?",
                        (str(shard.path),)).fetchone()
    if known and (known["size"], known["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns):
        report.unchanged += 1
        return
    rows = Rows(run, shard)
    digest, count = rows.read()
    if shard.expected is not None and count != shard.expected:
        report.pending += 1  # rewritten since the manifest counted it: next time
        report.pending_paths.append(str(shard.path))
        return
    con.execute("BEGIN IMMEDIATE")
    try:
        # another `index` may have taken this shard while it was being read: look again
        known = con.execute("SELECT id, digest FROM shards WHERE path = ?",
                            (str(shard.path),)).fetchone()
        if known and known["digest"] == digest:  # touched, not changed
            con.execute(f"UPDATE shards SET size = ?, mtime_ns = ?, {_PROVENANCE_SET} "
                        "WHERE id = ?", (stat.st_size, stat.st_mtime_ns,
                                         *_provenance(shard), known["id"]))
            report.unchanged += 1
        else:
            shard_id = _replace_shard(con, run_id, shard, known, stat, digest, count)
            rows.write(con, shard_id, run_id)
            report.indexed += 1
            report.records.update(rows.counts)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _replace_shard(con: sqlite3.Connection, run_id: int, shard: ShardFile,
                   known: sqlite3.Row | None, stat: os.stat_result, digest: str,
                   count: int) -> int:
    values = (run_id, shard.stage, shard.kind, shard.round, stat.st_size, stat.st_mtime_ns,
              digest, count, *_provenance(shard))
    if known is None:
        cur = con.execute("INSERT INTO shards(run_id, stage, kind, round, size, mtime_ns, "
                          f"digest, records, {', '.join(PROVENANCE)}, path) "
                          "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", values + (str(shard.path),))
        return cur.lastrowid
    for table in SHARD_TABLES:
        con.execute(f"DELETE FROM {table} WHERE shard_id = ?", (known["id"],))
    con.execute("UPDATE shards SET run_id=?, stage=?, kind=?, round=?, size=?, mtime_ns=?, "
                f"digest=?, records=?, {_PROVENANCE_SET} WHERE id=?", values + (known["id"],))
    return known["id"]


_PROVENANCE_SET = ", ".join(f"{column} = ?" for column in PROVENANCE)


def _provenance(shard: ShardFile) -> tuple[str | None, ...]:
    return tuple(shard.provenance.get(column) for column in PROVENANCE)


class Rows:
    """The rows one shard gives, table by table, gathered before its transaction."""

    def __init__(self, run: RunDir, shard: ShardFile):
        self.run, self.shard = run, shard
        self.tables: dict[str, list[tuple]] = {name: [] for name in COLUMNS}
        self.envs: list[tuple] = []
        self.plays: dict[tuple, list] = {}  # (env, round, policy, hint) -> running stats
        self.counts: Counter = Counter()

    def read(self) -> tuple[str, int]:
        """Read the shard into rows; returns (sha256 of its lines, number of records)."""
        sha = hashlib.sha256()
        if self.shard.kind == "checkpoint":
            data = self.shard.path.read_bytes()
            sha.update(data)
            self.checkpoint(orjson.loads(data))
            return sha.hexdigest(), 1
        count = 0
        for lineno, line in enumerate(_lines(self.shard.path), 1):
            sha.update(line)
            if not line.strip():
                continue
            where = f"{self.shard.path}:{lineno}"
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise RecordError(f"invalid JSON: {exc}", where) from None
            self.add(data, where)
            count += 1
        self._close_plays()
        return sha.hexdigest(), count

    def add(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise RecordError("expected a JSON object", where)
        version = data.get("v", VERSION)
        if isinstance(version, int) and version > VERSION:
            raise RecordError(f"field 'v': version {version} was written by a newer spade "
                              f"(this one reads up to {VERSION})", where)
        kind = data.get("kind")
        handler = getattr(self, f"on_{kind}", None) if kind in KINDS else None
        if handler is None:
            self.counts["other"] += 1
            return
        if MODELS[kind].checked:
            data = _checked(data, where)
        try:
            handler(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"field {exc}: missing or of the wrong type", where) from None
        self.counts[kind] += 1

    def _edges(self, data: dict) -> None:
        self.tables["edges"].extend((data["id"], parent) for parent in data.get("parents") or ())

    def on_design(self, d: dict) -> None:
        meta = d.get("meta") or {}
        prompt = d.get("prompt")
        self.tables["designs"].append((
            d["id"], id_key(d["id"]), d.get("round", 0), d.get("slot", 0), d.get("attempt", 0),
            d.get("domain"), d.get("skill", ""), d.get("difficulty"), d.get("corpus_doc"),
            meta.get("doc_title"),
            prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode(),
            len(d.get("completion") or ""), orjson.dumps(d.get("memory_ids") or []).decode(),
            self.run.policy(d.get("policy")), int(d.get("ok", True))))
        self._edges(d)

    def on_env(self, d: dict) -> None:
        meta = d.get("meta") or {}
        self.envs.append((d["id"], d["source_hash"], d["domain"], d.get("skill", ""),
                          d["class_name"], d["max_turns"],
                          orjson.dumps(d.get("tools") or []).decode(), d["source"]))
        parents = d.get("parents") or []
        design = next((p for p in parents if p.startswith("des_")), parents[0] if parents else None)
        verdict = {k: meta[k] for k in ("validation", "trivial", "oracle", "source_file")
                   if k in meta}
        trivial = meta.get("trivial") or {}
        self.tables["env_records"].append((
            d["id"], design, self.run.policy(d.get("policy")), d.get("hint"),
            meta.get("oracle", "solution"), trivial.get("chance"), orjson.dumps(verdict).decode()))
        self._edges(d)

    def on_validation(self, d: dict) -> None:
        error = d.get("error") or {}
        parents = d.get("parents") or []
        self.tables["validations"].append((
            d["id"], parents[0] if parents else None, d.get("round", 0), d.get("slot", 0),
            d.get("attempt", 0), d.get("domain"), d.get("skill", ""), d["check"],
            d.get("outcome", "ok"), error.get("msg"), d.get("source_hash"),
            self.run.policy(d.get("policy"))))
        self._edges(d)

    def on_rollout(self, d: dict) -> None:
        env_id, round_ = d["env_id"], d.get("round", 0)
        self.tables["plays"].append((id_key(d["id"]), env_id, round_))
        key = (env_id, round_, self.run.policy(d.get("policy")), int(bool(d.get("hint"))))
        reward = float(d.get("reward", 0.0))
        stats = self.plays.get(key)
        if stats is None:
            stats = self.plays[key] = [0, 0, 0, 0.0, reward, reward, 0]
        stats[0] += 1
        stats[1] += bool(d.get("ok", True))
        stats[2] += reward > 0  # a win, as score-regret's solve rate counts one
        stats[3] += reward
        stats[4] = min(stats[4], reward)
        stats[5] = max(stats[5], reward)
        stats[6] += len(d.get("turns") or ())

    def _close_plays(self) -> None:
        self.tables["play_stats"].extend(key + tuple(stats) for key, stats in self.plays.items())

    def on_regret(self, d: dict) -> None:
        self.tables["regrets"].append((
            d["id"], d.get("env_id", ""), d.get("design_id"), d.get("skill", ""),
            d.get("round", 0), d.get("variant"), d.get("regret", 0.0), d.get("regret_n", 0.0),
            d.get("win", 0.0), d.get("solve_rate", 0.0), d.get("plateau", 0.0),
            d.get("designer_reward", 0.0), d.get("designer_advantage", 0.0),
            d.get("hint_reward"), d.get("no_hint_reward"), d.get("n_hint", 0),
            d.get("n_no_hint", 0), int(d.get("broken", False)), int(d.get("hint_leaks", False)),
            int(d.get("at_chance", False)), d.get("rejected_by")))
        self._edges(d)

    def on_train(self, d: dict) -> None:
        stats = d.get("stats") or {}
        parents = d.get("parents") or []
        key = id_key(d["id"])
        self.tables["trains"].append((
            d["id"], key, self.shard.round, d["step"], d.get("role", "agent"),
            self.run.policy(d.get("policy")), stats.get("loss"), orjson.dumps(stats).decode(),
            len(parents)))
        self.tables["train_inputs"].extend((key, id_key(p)) for p in parents)

    def on_eval(self, d: dict) -> None:
        self.tables["evals"].append((
            d["id"], d["suite"], d.get("task", ""), d.get("category", ""), d.get("round"),
            d.get("score", 0.0), d.get("samples", 1), d.get("ci_low"), d.get("ci_high"),
            self.run.policy(d.get("policy")), int(d.get("ok", True))))
        self._edges(d)

    def checkpoint(self, state: dict) -> None:
        step_dir = self.shard.path.parent
        self.tables["checkpoints"].append((
            str(step_dir), step_dir.name, state.get("step"), state.get("round"),
            state.get("inputs"), self.run.policy(state.get("parent")),
            len(state.get("train") or ())))
        self.counts["checkpoint"] += 1

    def write(self, con: sqlite3.Connection, shard_id: int, run_id: int) -> None:
        con.executemany(f"INSERT OR IGNORE INTO envs({', '.join(ENV_COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(ENV_COLUMNS))})", self.envs)
        for table, rows in self.tables.items():
            if not rows:
                continue
            owner = (shard_id,) if table in WITHOUT_RUN else (shard_id, run_id)
            names = ("shard_id",) if table in WITHOUT_RUN else ("shard_id", "run_id")
            columns = names + COLUMNS[table]
            con.executemany(f"INSERT OR IGNORE INTO {table}({', '.join(columns)}) VALUES "
                            f"({', '.join('?' * len(columns))})",
                            (owner + row for row in rows))


def _checked(data: dict, where: str) -> dict:
    """An env or design as every reader takes it (`parse`): one without an id gets its
    content's, one whose id is not its content's is a RecordError."""
    try:
        record = parse(data)
    except RecordError as exc:
        raise RecordError(exc.msg, where) from None
    return {**data, "id": record.id}


def _lines(path: Path) -> Iterator[bytes]:
    """A shard's lines (decompressed by suffix), none longer than the readers' cap."""
    limit = max_line_bytes()
    with open_text(str(path)) as fh:
        lineno = 0
        while True:
            line = fh.readline(limit + 1)
            if not line:
                return
            lineno += 1
            if len(line) > limit and not (len(line) == limit + 1 and line.endswith(b"\n")):
                raise RecordError(f"a line longer than {limit} bytes", f"{path}:{lineno}")
            yield line
