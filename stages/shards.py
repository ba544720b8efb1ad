"""JSONL shards: reading, atomic writing, manifests and resume.

In: paths (`-` for stdin, files, directories of shards; `.jsonl`, `.jsonl.gz`, `.jsonl.zst`).
Out: records, and shard directories `<kind>-<index:05d>.jsonl` with `_manifest.json`.
Guarantees:
- a bad line stops reading with `path:line: field 'x': message` (RecordError), and so does a
  compressed file that is corrupt or cut off (`path: not a complete gzip file: ...`), or an env
  or design whose id is not its content's (`path:line: id does not match its content ...`);
- a stage uses each input record once: `run_stage` (and `unique`, for a stage that reads its
  inputs whole) drops a record whose kind and id it has already met among the stage's inputs,
  in any shard, counting it in `Stats` (`duplicates`, and the CLI's warning line);
- no record read holds NaN or an infinity (see stages.records);
- a line longer than `max_line_bytes()` (MAX_LINE_BYTES, 64 MiB; the environment variable
  SPADE_MAX_LINE_BYTES sets another) stops reading with `path:line: a line longer than N bytes`
  (RecordError, exit 65) once that many bytes of it are read: reading holds at most the cap of
  one line, never the whole over-long line (`/dev/zero` as a shard, a small `.jsonl.gz` that
  expands to gigabytes);
- an output that cannot be written raises OutputError naming the path, one line: exit 74
  (EX_IOERR) for a full disk or quota (ENOSPC, EDQUOT, EFBIG, EIO), 73 (EX_CANTCREAT) for the
  rest (a read-only or unwritable dir, `-o` at a dangling symlink or at a file where a
  directory belongs); the temp file is removed, so nothing partial is left;
- a final file exists only when complete (temp file in the same dir, fsync, rename), with the
  mode the umask gives any new file; `remove_temp_files` clears what a killed writer left;
- while a write root is set (`spade run`: the run directory), no file, folder or journal is
  written through a symlink out of it, nor at a destination that is a symlink: Untrusted, exit
  77 (stages/trust.py);
- a rerun skips an input shard whose outputs the manifest lists with the same input hash and
  config digest, and redoes the rest; the manifest is rewritten after each finished shard;
- a stage without input shards (`emit`) may keep each record as it is made in a journal beside
  its output directory; a rerun of the same config gets those records back (design takes
  them instead of asking the model again); the journal goes once the output is written;
- each finished shard's manifest entry carries the provenance of the run that wrote it
  (stages/provenance.py: spade version, validator or reward digest), so a shard a rerun kept
  is never credited to code that did not judge it.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import re
import secrets
import sys
import threading
import time
import zlib
from collections import Counter
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

import orjson

from stages import trust
from stages.provenance import stamp
from stages.records import MODELS, Record, RecordError, content_hash, dumps, parse

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
MANIFEST = "_manifest.json"
CHUNK = 1 << 20  # bytes per read of a compressed shard
MAX_LINE_BYTES = 64 << 20  # longest shard line read; SPADE_MAX_LINE_BYTES overrides it
MAX_LINE_ENV = "SPADE_MAX_LINE_BYTES"
EX_CANTCREAT, EX_IOERR = 73, 74  # sysexits.h: an output that cannot be made / an I/O error
FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


class InputMissing(FileNotFoundError):
    """An input path that does not exist (exit 66)."""


class OutputError(OSError):
    """An output that cannot be written: `code` is EX_IOERR (disk full, I/O error) or
    EX_CANTCREAT (anything else: permissions, read-only, a dangling symlink)."""

    def __init__(self, msg: str, code: int):
        super().__init__(msg)
        self.msg, self.code = msg, code

    def __str__(self) -> str:
        return self.msg

    @classmethod
    def of(cls, exc: OSError, path: str | Path) -> "OutputError":
        if isinstance(exc, OutputError):
            return exc
        path = str(path)
        why = exc.strerror or str(exc)
        if os.path.islink(path) and not os.path.exists(path):
            why = f"it is a symlink to {os.readlink(path)}, which does not exist"
        elif exc.errno == errno.EEXIST:
            why = "it exists and is not a directory"
        code = EX_IOERR if exc.errno in FULL else EX_CANTCREAT
        return cls(f"{path}: cannot write the output: {why}", code)


def max_line_bytes() -> int:
    """The longest shard line read: $SPADE_MAX_LINE_BYTES when set, else MAX_LINE_BYTES."""
    value = os.environ.get(MAX_LINE_ENV, "").strip()
    if not value:
        return MAX_LINE_BYTES
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise RecordError(f"{MAX_LINE_ENV} must be a positive number of bytes, got {value!r}")
    return limit


@dataclass(frozen=True)
class Shard:
    """One input: a file, stdin when `path` is `-`, or records already in memory."""

    path: str
    index: int
    records: tuple[Record, ...] | None = None

    def digest(self) -> str | None:
        if self.records is not None:
            return content_hash([record.to_dict() for record in self.records])
        if self.path == "-":
            return None
        sha = hashlib.sha256()
        with open(self.path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                sha.update(block)
        return sha.hexdigest()


def find_shards(inputs: Iterable[str], kinds: set[str] | None = None) -> list[Shard]:
    """Expand paths and directories into an ordered list of input shards.

    In a directory, files named `<kind>-*.jsonl` for a kind outside `kinds` are left out, so a
    stage can read another stage's output dir (validate writes env and validation files side
    by side). Files named explicitly are always read.
    """
    paths: list[str] = []
    for item in inputs:
        if item == "-":
            paths.append(item)
        elif os.path.isdir(item):
            found = sorted(str(p) for p in Path(item).iterdir()
                           if p.name.endswith(SUFFIXES) and not p.name.startswith((".", "_"))
                           and _wanted(p.name, kinds))
            paths.extend(found)
        elif os.path.exists(item):
            paths.append(item)
        else:
            raise InputMissing(f"{item}: no such file or directory")
    return [Shard(path, index) for index, path in enumerate(paths)]


def _wanted(name: str, kinds: set[str] | None) -> bool:
    kind = name.split("-", 1)[0]
    return kinds is None or kind not in MODELS or kind in kinds


@contextmanager
def open_text(path: str) -> Iterator[IO[bytes]]:
    """Binary reader for a shard path, decompressing by suffix; `-` is stdin.

    A compressed file that is corrupt, not of its suffix's format, or cut off (its last gzip
    member or zstd frame never ends) raises RecordError naming the file when read.
    """
    if path == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as raw:
        if path.endswith(".gz"):
            chunks = _gzip_chunks(raw, path)
        elif path.endswith(".zst"):
            chunks = _zstd_chunks(raw, path)
        else:
            yield raw
            return
        with closing(chunks):
            yield io.BufferedReader(_ChunkReader(chunks), CHUNK)


def _gzip_chunks(raw: IO[bytes], path: str) -> Iterator[bytes]:
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
            yield from iter(lambda: fh.read(CHUNK), b"")
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise RecordError(f"not a complete gzip file: {exc}", path) from None


def _zstd_chunks(raw: IO[bytes], path: str) -> Iterator[bytes]:
    """Frame by frame: zstandard's stream reader ends a cut-off frame as if it were complete."""
    import zstandard

    decompressor = zstandard.ZstdDecompressor()
    frame = None
    try:
        for block in iter(lambda: raw.read(CHUNK), b""):
            while block:
                if frame is None:
                    frame = decompressor.decompressobj()
                yield frame.decompress(block)
                block = b""
                if frame.eof:  # what follows the frame's end is the next frame
                    block, frame = frame.unused_data, None
    except zstandard.ZstdError as exc:
        raise RecordError(f"not a complete zstd file: {exc}", path) from None
    if frame is not None:
        raise RecordError("not a complete zstd file: it ends inside a frame", path)


class _ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks, self.pending = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.pending = memoryview(chunk)
        count = min(len(buffer), len(self.pending))
        buffer[:count] = self.pending[:count]
        self.pending = self.pending[count:]
        return count


def read_shard(shard: Shard | str, kinds: set[str] | None = None) -> Iterator[Record]:
    if isinstance(shard, Shard) and shard.records is not None:
        yield from shard.records
        return
    path = shard.path if isinstance(shard, Shard) else shard
    name = "<stdin>" if path == "-" else path
    limit = max_line_bytes()
    with open_text(path) as fh:
        for lineno, line in enumerate(_lines(fh, limit), 1):
            if line is None:
                raise RecordError(f"a line longer than {limit} bytes (set {MAX_LINE_ENV} to "
                                  "read longer ones)", f"{name}:{lineno}")
            if not line.strip():
                continue
            try:
                yield parse(orjson.loads(line), kinds)
            except orjson.JSONDecodeError as exc:
                raise RecordError(f"invalid JSON: {exc}", f"{name}:{lineno}") from None
            except RecordError as exc:
                raise RecordError(exc.msg, f"{name}:{lineno}") from None


def _lines(fh: IO[bytes], limit: int) -> Iterator[bytes | None]:
    """The lines of `fh`, each read with at most `limit` + 1 bytes in hand; None for a line
    longer than `limit` (its newline not counted), which ends the reading."""
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not (len(line) == limit + 1 and line.endswith(b"\n")):
            yield None
            return
        yield line


def read(inputs: Iterable[str], kinds: set[str] | None = None) -> Iterator[Record]:
    """All records of all inputs, in order."""
    for shard in find_shards(inputs, kinds):
        yield from read_shard(shard, kinds)


def encode(records: Iterable[Record | dict[str, Any]]) -> Iterator[bytes]:
    for record in records:
        yield dumps(record)


def write_atomic(path: str | Path, lines: Iterable[bytes]) -> int:
    """Write lines to `path` via a temp file in the same dir; returns the number of lines.

    The file gets the mode any new file gets (0o666 less the umask). Never through a link out
    of the write root (trust.check_write)."""
    path = Path(path)
    trust.check_write(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        # 0o666 less the umask, as any new file (mkstemp would make it 0600 whatever the umask)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise OutputError.of(exc, path) from None
    count = 0
    source = iter(lines)
    try:
        with os.fdopen(fd, "wb") as raw, _compressor(raw, path.name) as fh:
            while True:
                try:
                    line = next(source)
                except StopIteration:
                    break
                except OSError as exc:  # the stage's own (its inputs, its env workers)
                    raise _Upstream(exc) from None
                fh.write(line)
                count += 1
            fh.flush()
        with open(tmp, "rb+") as fh:  # fsync after the compressor has closed its frame
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except _Upstream as upstream:
        Path(tmp).unlink(missing_ok=True)
        raise upstream.exc
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError.of(exc, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return count


TEMP_FILE = re.compile(r"^\..+\.[0-9a-f]{16}\.tmp$")  # what write_atomic writes beside a file


def remove_temp_files(root: str | Path) -> int:
    """Delete the temp files write_atomic left under `root` when its process was killed between
    writing one and renaming it (a finished rerun never writes that name again); returns how
    many. Only for a tree no other writer is using (`spade run` holds the run lock)."""
    removed = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if TEMP_FILE.match(name):
                Path(folder, name).unlink(missing_ok=True)
                removed += 1
    return removed


class _Upstream(Exception):
    """An OSError raised while making the lines write_atomic writes: not the output's."""

    def __init__(self, exc: OSError):
        super().__init__(str(exc))
        self.exc = exc


def make_dirs(path: str | Path) -> None:
    """mkdir -p for an output, an OSError (a dangling symlink, read-only) as OutputError;
    never through a link out of the write root (trust.check_write)."""
    trust.check_write(path)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError.of(exc, path) from None


@contextmanager
def _compressor(raw: IO[bytes], name: str) -> Iterator[IO[bytes]]:
    if name.endswith(".gz"):
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
            yield fh
    elif name.endswith(".zst"):
        import zstandard

        with zstandard.ZstdCompressor().stream_writer(raw, closefd=False) as fh:
            yield fh
    else:
        yield raw


@dataclass
class Stats:
    """Counters a stage fills while it runs; the CLI prints them as the summary line."""

    read: int = 0
    written: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    skipped_shards: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # stage-specific diagnostics
    started: float = field(default_factory=time.monotonic)
    seen: Counter = field(default_factory=Counter)  # (kind, id) -> times met among the inputs

    def first(self, record: Record) -> bool:
        """Count `record` among the stage's inputs: False when its kind and id came before."""
        key = (record.kind, record.id)
        self.seen[key] += 1
        return self.seen[key] == 1

    def repeated(self) -> list[tuple[str, str, int]]:
        """(kind, id, times) of each input met more than once, in first-seen order."""
        return [(kind, id_, n) for (kind, id_), n in self.seen.items() if n > 1]

    @property
    def duplicates(self) -> int:
        """Input records dropped as repeats of one met before."""
        return sum(n - 1 for n in self.seen.values())

    def as_dict(self) -> dict[str, Any]:
        return {"read": self.read, "written": dict(self.written), "reasons": dict(self.reasons),
                "skipped_shards": self.skipped_shards, "duplicates": self.duplicates,
                **self.extra, "seconds": round(time.monotonic() - self.started, 3)}


def unique(records: Iterable[Record], stats: Stats) -> Iterator[Record]:
    """The records met for the first time in this stage (see Stats.first); repeats dropped."""
    return (record for record in records if stats.first(record))


Transform = Callable[[Iterator[Record]], Iterator[Record]]


def run_stage(stage: str, shards: list[Shard], out: str, transform: Transform,
              config: dict[str, Any], stats: Stats, kinds: set[str] | None = None,
              overwrite: bool = False, suffix: str = ".jsonl") -> None:
    """Feed each input shard through `transform` and write what comes out.

    `out` is `-` (stdout, streaming, no resume), a file named `*.jsonl[.gz|.zst]` (every
    record in one file, written atomically), or a directory (one output file per produced kind
    per input shard, resumable). Records are counted into `stats`. With `kinds`, records of
    other kinds pass by; a shard holding none of `kinds` is a RecordError. A record of `kinds`
    met before in this stage's inputs (same kind and id, in any shard, one a rerun skips
    included) is dropped: an env listed twice is played once.
    """

    def counted(records: Iterator[Record]) -> Iterator[Record]:
        for record in transform(records):
            stats.written[record.kind] += 1
            yield record

    def inputs(shard: Shard) -> Iterator[Record]:
        # Records of other kinds pass by (a pipe from validate carries env and validation
        # records); a shard with nothing this stage reads is an input error.
        wanted, passed = 0, Counter()
        for record in read_shard(shard):
            if kinds is not None and record.kind not in kinds:
                passed[record.kind] += 1
                continue
            wanted += 1
            if stats.first(record):
                stats.read += 1
                yield record
        if passed and not wanted:
            found = ", ".join(f"{count} {kind}" for kind, count in passed.most_common())
            raise RecordError(f"no {' or '.join(sorted(kinds))} records, only {found}",
                              "<stdin>" if shard.path == "-" else shard.path)

    if out == "-":
        sink = sys.stdout.buffer
        for shard in shards:
            for line in encode(counted(inputs(shard))):
                _to_stdout(sink.write, line)
            _to_stdout(sink.flush)
        return
    if out.endswith(SUFFIXES):
        make_dirs(Path(out).parent)
        write_atomic(out, encode(record for shard in shards for record in counted(inputs(shard))))
        return

    def met(shard: Shard) -> None:  # a shard a rerun skips: what it held was used there
        for record in read_shard(shard):
            if kinds is None or record.kind in kinds:
                stats.first(record)

    ShardDir(out, stage, config).run(shards, lambda s: counted(inputs(s)), stats, overwrite,
                                     suffix, met)


def _to_stdout(call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except BrokenPipeError:  # `| head`: a normal way to stop reading (exit 0)
        raise
    except OSError as exc:
        raise OutputError.of(exc, "<stdout>") from None


def emit(stage: str, out: str, produce: Callable[[Journal], Iterator[Record]],
         config: dict[str, Any], stats: Stats, overwrite: bool = False,
         suffix: str = ".jsonl") -> int:
    """Write what a stage without input shards makes (one output shard, index 0), and return
    how many records the journal of a stopped run held (`journal.made`, offered to `produce`).

    `produce(journal)` yields every record of the output. Into a directory, `journal.made`
    holds the records a run with the same config made before it was stopped, and
    `journal.keep(record)` saves one the moment it is made: a stage that generates for hours
    takes the made ones as they are and makes only the rest (design does). Elsewhere (`-`, a
    file) the journal is empty and keeps nothing."""
    source = Shard(path="<generated>", index=0, records=())
    journal = Journal(None if out == "-" or out.endswith(SUFFIXES) else Path(out),
                      content_hash(config), overwrite)
    run_stage(stage, [source], out, lambda _records: produce(journal), config, stats,
              overwrite=overwrite, suffix=suffix)
    journal.close()
    return len(journal.made)


class Journal:
    """The records of an unfinished output, one line each, appended as they are made.

    It lives beside the output as `_journal-<config digest>.jsonl` (readers skip `_` names),
    and goes once the output is written. A journal of another config, or any with
    `overwrite`, is removed at the start. The last line of a killed writer may be cut off:
    reading stops at the first line that does not parse."""

    def __init__(self, folder: Path | None, digest: str, overwrite: bool):
        self.path = None if folder is None else folder / f"_journal-{digest[:16]}.jsonl"
        self.made: list[Record] = []
        self._file: IO[bytes] | None = None
        self._lock = threading.Lock()
        if self.path is None:
            return
        for stale in folder.glob("_journal-*.jsonl"):
            if overwrite or stale != self.path:
                stale.unlink(missing_ok=True)
        self.made = list(self._read())

    def _read(self) -> Iterator[Record]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in data.splitlines():
            try:
                yield parse(orjson.loads(line))
            except (orjson.JSONDecodeError, RecordError):
                return

    def keep(self, record: Record) -> None:
        """Append `record` (safe from several threads); a no-op where there is no journal."""
        if self.path is None:
            return
        line = dumps(record)
        with self._lock:
            try:
                if self._file is None:
                    self._file = trust.open_append(self.path, "ab")
                self._file.write(line)
                self._file.flush()
            except OSError as exc:
                raise OutputError.of(exc, self.path) from None

    def close(self) -> None:
        """The output is written: the journal is no longer needed."""
        if self._file is not None:
            self._file.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class ShardDir:
    """An output directory with a manifest that makes reruns resume."""

    def __init__(self, path: str, stage: str, config: dict[str, Any]):
        self.path = Path(path)
        self.stage = stage
        self.config = config
        self.digest = content_hash(config)
        self.provenance = stamp(stage, config)

    def run(self, shards: list[Shard], produce: Callable[[Shard], Iterator[Record]],
            stats: Stats, overwrite: bool, suffix: str,
            skipped: Callable[[Shard], None] = lambda _shard: None) -> None:
        make_dirs(self.path)
        manifest = self._load()
        done = {} if overwrite or manifest.get("config_digest") != self.digest \
            else manifest.get("shards", {})
        finished: dict[str, Any] = {}
        for shard in shards:
            key = f"{shard.index:05d}"
            input_hash = shard.digest()
            previous = done.get(key)
            if previous and input_hash and previous["input_hash"] == input_hash and all(
                    (self.path / name).exists() for name in previous["outputs"]):
                finished[key] = previous
                stats.skipped_shards += 1
                skipped(shard)
                continue
            finished[key] = self._write_shard(shard, produce(shard), input_hash, suffix)
            self._save(finished, stats, complete=False)
        self._save(finished, stats, complete=True)

    def _write_shard(self, shard: Shard, records: Iterator[Record], input_hash: str | None,
                     suffix: str) -> dict[str, Any]:
        by_kind: dict[str, list[bytes]] = {}
        for record in records:
            by_kind.setdefault(record.kind, []).append(dumps(record))
        outputs = {}
        for kind, lines in sorted(by_kind.items()):
            name = f"{kind}-{shard.index:05d}{suffix}"
            outputs[name] = write_atomic(self.path / name, lines)
        return {"input": shard.path, "input_hash": input_hash, "outputs": outputs,
                "provenance": self.provenance}

    def _load(self) -> dict[str, Any]:
        try:
            return orjson.loads((self.path / MANIFEST).read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return {}

    def _save(self, shards: dict[str, Any], stats: Stats, complete: bool) -> None:
        manifest = {"stage": self.stage, "spade_version": self.provenance["spade_version"],
                    "complete": complete,
                    "config_digest": self.digest, "config": self.config, "shards": shards,
                    "stats": stats.as_dict()}
        write_atomic(self.path / MANIFEST,
                     [orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n"])
