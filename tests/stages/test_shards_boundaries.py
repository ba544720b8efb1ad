"""stages/shards.py at its limits: the line cap on both sides and its setting, which files a
directory lends a stage, the one-line output errors and their exit codes, atomic writes that
leave nothing partial, the manifest a rerun resumes from (and when it must not), and the
counters of the summary line."""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import random
import re
import sys
import time
import tracemalloc
from pathlib import Path

import orjson
import pytest

from stages import provenance, shards
from stages.records import Design, Env, RecordError, content_hash, dumps
from stages.shards import (EX_CANTCREAT, EX_IOERR, MANIFEST, MAX_LINE_BYTES, MAX_LINE_ENV,
                           OutputError, Shard, Stats, emit, find_shards, max_line_bytes, read,
                           read_shard, run_stage, write_atomic)


def designs(n, start=0):
    return [Design(completion=f"answer {i}") for i in range(start, start + n)]


def env_record(name="a"):
    source = f"class {name.title()}Env:\n    pass\n"
    return Env(domain="game", class_name=f"{name.title()}Env", source=source,
               source_hash=name, max_turns=3)


def write_shard(path, records):
    return write_atomic(path, [dumps(r) for r in records])


def kept(records):
    yield from records


def upper(records):
    for record in records:
        yield Design(completion=record.completion.upper())


def manifest(out):
    return orjson.loads((Path(out) / MANIFEST).read_bytes())


# -- the line cap --------------------------------------------------------------------------------

@pytest.mark.parametrize("value,limit", [(None, MAX_LINE_BYTES), ("", MAX_LINE_BYTES),
                                         ("  ", MAX_LINE_BYTES), ("1", 1), (" 12 ", 12),
                                         ("65536", 65536)])
def test_the_line_cap_is_the_setting_or_64_mib(monkeypatch, value, limit):
    if value is None:
        monkeypatch.delenv(MAX_LINE_ENV, raising=False)
    else:
        monkeypatch.setenv(MAX_LINE_ENV, value)
    assert max_line_bytes() == limit
    assert MAX_LINE_BYTES == 64 * 1024 * 1024 and MAX_LINE_ENV == "SPADE_MAX_LINE_BYTES"


@pytest.mark.parametrize("value", ["0", "-3", "lots", "1.5"])
def test_a_cap_that_is_not_a_positive_integer_names_the_setting_and_the_value(monkeypatch,
                                                                               value):
    monkeypatch.setenv(MAX_LINE_ENV, f" {value} ")
    with pytest.raises(RecordError) as raised:
        max_line_bytes()
    assert str(raised.value) == (f"SPADE_MAX_LINE_BYTES must be a positive number of bytes, "
                                 f"got {value!r}")


LINE = dumps(Design(completion="x"))  # with its newline


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_lines_exactly_at_the_cap_are_read_with_or_without_a_newline(tmp_path, monkeypatch,
                                                                      suffix):
    body = len(LINE) - 1
    monkeypatch.setenv(MAX_LINE_ENV, str(body))
    path = tmp_path / f"design-00000{suffix}"
    data = LINE + LINE + LINE.rstrip(b"\n")
    path.write_bytes(gzip.compress(data) if suffix.endswith("gz") else data)
    assert len(list(read_shard(str(path)))) == 3


@pytest.mark.parametrize("last", [False, True])
def test_a_line_one_byte_over_the_cap_is_refused_at_its_line(tmp_path, monkeypatch, last):
    monkeypatch.setenv(MAX_LINE_ENV, str(len(LINE) - 2))
    path = tmp_path / "d.jsonl"
    path.write_bytes(LINE.rstrip(b"\n") if last else LINE + LINE)
    with pytest.raises(RecordError) as raised:
        list(read_shard(str(path)))
    assert str(raised.value) == (f"{path}:1: a line longer than {len(LINE) - 2} bytes (set "
                                 "SPADE_MAX_LINE_BYTES to read longer ones)")


def test_the_cap_counts_lines_after_blank_ones_and_names_stdin(tmp_path, monkeypatch):
    limit = len(LINE) - 1
    monkeypatch.setenv(MAX_LINE_ENV, str(limit))
    data = LINE + b"\n   \n" + b"x" * (limit + 1) + b"\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    with pytest.raises(RecordError, match=rf"^<stdin>:4: a line longer than {limit} bytes"):
        list(read(["-"]))


def test_blank_lines_are_skipped_and_a_bad_one_is_named_by_its_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n" + LINE + b"  \n" + LINE + b"[1]\n")
    with pytest.raises(RecordError, match=rf"^{path}:5: "):
        list(read([str(path)]))
    path.write_bytes(b"\n" + LINE + b"  \n" + LINE)
    assert len(list(read([str(path)]))) == 2


def test_a_compressed_shard_bigger_than_one_chunk_reads_whole(tmp_path):
    records = [Design(completion=f"{i} " + "z" * 5000) for i in range(500)]  # > 2 MiB unpacked
    for suffix in (".jsonl.gz", ".jsonl.zst"):
        path = tmp_path / f"design-00000{suffix}"
        write_shard(path, records)
        assert [r.completion for r in read([str(path)])] == [r.completion for r in records]


# -- which files a directory lends a stage -------------------------------------------------------

def test_a_directory_lends_only_shards_of_the_kinds_asked_and_of_no_known_kind(tmp_path):
    for name in ("env-00000.jsonl", "validation-00000.jsonl", "extra-00000.jsonl",
                 "design-00001.jsonl.gz", "design-00002.jsonl.zst", "notes.json",
                 "design-00003.txt", "_other.jsonl", ".design-00004.jsonl",
                 "env-extra-00005.jsonl"):
        (tmp_path / name).write_bytes(b"")
    names = lambda kinds: [Path(s.path).name for s in find_shards([str(tmp_path)], kinds)]
    # the kind is the name up to its first hyphen
    assert names({"env"}) == ["env-00000.jsonl", "env-extra-00005.jsonl", "extra-00000.jsonl"]
    assert names(None) == ["design-00001.jsonl.gz", "design-00002.jsonl.zst", "env-00000.jsonl",
                           "env-extra-00005.jsonl", "extra-00000.jsonl",
                           "validation-00000.jsonl"]
    assert names({"design", "validation"}) == ["design-00001.jsonl.gz", "design-00002.jsonl.zst",
                                               "extra-00000.jsonl", "validation-00000.jsonl"]


def test_a_file_named_explicitly_is_read_whatever_its_kind_and_shards_are_numbered_in_order(
        tmp_path):
    (tmp_path / "dir").mkdir()
    for name in ("dir/design-00000.jsonl", "dir/design-00001.jsonl", "validation-00009.jsonl"):
        (tmp_path / name).write_bytes(b"")
    found = find_shards([str(tmp_path / "validation-00009.jsonl"), "-", str(tmp_path / "dir")],
                        {"design"})
    assert [(Path(s.path).name, s.index) for s in found] == [
        ("validation-00009.jsonl", 0), ("-", 1), ("design-00000.jsonl", 2),
        ("design-00001.jsonl", 3)]


def test_a_missing_input_names_the_path(tmp_path):
    with pytest.raises(shards.InputMissing) as raised:
        find_shards([str(tmp_path), str(tmp_path / "nope")])
    assert str(raised.value) == f"{tmp_path / 'nope'}: no such file or directory"
    assert isinstance(raised.value, FileNotFoundError)


def test_a_shards_digest_is_its_bytes_its_records_or_none_for_stdin(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"x" * ((1 << 20) + 7))
    assert Shard(str(path), 0).digest() == hashlib.sha256(path.read_bytes()).hexdigest()
    assert Shard("-", 0).digest() is None
    records = tuple(designs(2))
    assert Shard("-", 0, records).digest() == content_hash([r.to_dict() for r in records])
    assert Shard("m", 0, records).digest() != Shard("m", 0, records[:1]).digest()
    assert Shard("m", 0, ()).digest() == content_hash([])


# -- output errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO])
def test_a_full_disk_or_io_error_is_exit_74_in_one_line(tmp_path, code):
    err = shards.OutputError.of(OSError(code, os.strerror(code)), tmp_path / "x.jsonl")
    assert err.code == EX_IOERR == 74
    assert str(err) == f"{tmp_path / 'x.jsonl'}: cannot write the output: {os.strerror(code)}"
    assert err.msg == str(err)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.ENOTDIR, errno.EPERM])
def test_any_other_output_error_is_exit_73(tmp_path, code):
    err = OutputError.of(OSError(code, os.strerror(code)), tmp_path / "x")
    assert err.code == EX_CANTCREAT == 73
    assert str(err).endswith(f": cannot write the output: {os.strerror(code)}")


def test_an_output_error_without_strerror_says_what_the_exception_says(tmp_path):
    err = OutputError.of(OSError("odd failure"), tmp_path / "x")
    assert str(err) == f"{tmp_path / 'x'}: cannot write the output: odd failure"
    assert err.code == 73
    assert OutputError.of(err, "elsewhere") is err  # already one: kept as it is


def test_an_output_dir_at_a_file_says_it_exists_and_is_not_a_directory(tmp_path):
    (tmp_path / "out").write_text("a file")
    source = Shard("<mem>", 0, tuple(designs(1)))
    with pytest.raises(OutputError) as raised:
        run_stage("t", [source], str(tmp_path / "out"), kept, {}, Stats())
    assert str(raised.value) == (f"{tmp_path / 'out'}: cannot write the output: it exists and "
                                 "is not a directory")
    assert raised.value.code == 73


def test_a_stdout_that_fails_is_an_output_error_but_a_closed_pipe_is_not(monkeypatch):
    source = Shard("<mem>", 0, tuple(designs(1)))

    class Sink:
        def __init__(self, exc):
            self.buffer = self
            self.exc = exc

        def write(self, data):
            raise self.exc

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Sink(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OutputError) as raised:
        run_stage("t", [source], "-", kept, {}, Stats())
    assert str(raised.value) == "<stdout>: cannot write the output: No space left on device"
    assert raised.value.code == 74
    monkeypatch.setattr(sys, "stdout", Sink(BrokenPipeError(errno.EPIPE, "pipe")))
    with pytest.raises(BrokenPipeError):
        run_stage("t", [source], "-", kept, {}, Stats())


def test_stdout_gets_every_record_of_every_shard_in_order(monkeypatch):
    out = io.TextIOWrapper(io.BytesIO())
    monkeypatch.setattr(sys, "stdout", out)
    stats = Stats()
    sources = [Shard("<a>", 0, tuple(designs(2))), Shard("<b>", 1, tuple(designs(1, start=2)))]
    run_stage("t", sources, "-", upper, {}, stats)
    lines = out.buffer.getvalue().splitlines()
    assert [orjson.loads(line)["completion"] for line in lines] == ["ANSWER 0", "ANSWER 1",
                                                                     "ANSWER 2"]
    assert stats.read == 3 and stats.written == {"design": 3}


# -- atomic writes -------------------------------------------------------------------------------

def test_write_atomic_counts_its_lines_and_leaves_only_the_final_file(tmp_path):
    assert write_atomic(tmp_path / "a.jsonl", [b"1\n", b"2\n", b"3\n"]) == 3
    assert write_atomic(tmp_path / "b.jsonl.gz", iter([b"1\n"])) == 1
    assert write_atomic(tmp_path / "c.jsonl", []) == 0
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl.gz", "c.jsonl"]
    assert (tmp_path / "a.jsonl").read_bytes() == b"1\n2\n3\n"
    assert (tmp_path / "c.jsonl").read_bytes() == b""


def test_a_gzip_shard_is_the_same_bytes_whenever_it_is_written(tmp_path):
    write_atomic(tmp_path / "a.jsonl.gz", [b"same\n"])
    first = (tmp_path / "a.jsonl.gz").read_bytes()
    write_atomic(tmp_path / "a.jsonl.gz", [b"same\n"])
    assert (tmp_path / "a.jsonl.gz").read_bytes() == first
    assert first[4:8] == b"\0\0\0\0"  # no timestamp in the header
    assert gzip.decompress(first) == b"same\n"


def test_an_interrupted_rewrite_keeps_the_previous_complete_file(tmp_path):
    path = tmp_path / "design-00000.jsonl"
    write_shard(path, designs(2))
    before = path.read_bytes()

    def lines():
        yield b"partial\n"
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        write_atomic(path, lines())
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name]


def test_an_error_in_the_lines_upstream_keeps_its_type_and_message(tmp_path):
    def lines():
        yield b"a\n"
        raise PermissionError(errno.EACCES, "input unreadable")

    with pytest.raises(PermissionError, match="input unreadable") as raised:
        write_atomic(tmp_path / "x.jsonl", lines())
    assert not isinstance(raised.value, OutputError)
    assert os.listdir(tmp_path) == []


def test_a_full_disk_at_the_rename_is_exit_74_and_leaves_nothing(tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OutputError) as raised:
        write_atomic(tmp_path / "x.jsonl", [b"a\n"])
    monkeypatch.undo()
    assert raised.value.code == 74 and str(raised.value).startswith(f"{tmp_path / 'x.jsonl'}: ")
    assert os.listdir(tmp_path) == []


def test_a_temp_file_that_cannot_be_made_names_the_output(tmp_path, monkeypatch,
                                                          refuse_temp_files):
    refuse_temp_files(errno.EACCES)
    with pytest.raises(OutputError) as raised:
        write_atomic(tmp_path / "x.jsonl", [b"a\n"])
    monkeypatch.undo()
    assert str(raised.value) == (f"{tmp_path / 'x.jsonl'}: cannot write the output: "
                                 f"{os.strerror(errno.EACCES)}")
    assert raised.value.code == 73 and os.listdir(tmp_path) == []


def test_a_file_output_in_a_new_dir_makes_the_dir(tmp_path):
    out = tmp_path / "a" / "b" / "all.jsonl.zst"
    run_stage("t", [Shard("<m>", 0, tuple(designs(2)))], str(out), kept, {}, Stats())
    assert [r.completion for r in read([str(out)])] == ["answer 0", "answer 1"]


# -- the manifest and resume ---------------------------------------------------------------------

def stage_dir(tmp_path, n=2, per=1):
    inputs = tmp_path / "in"
    inputs.mkdir(exist_ok=True)
    for i in range(n):
        write_shard(inputs / f"design-{i:05d}.jsonl", designs(per, start=i * per))
    return find_shards([str(inputs)])


def test_the_manifest_records_stage_config_outputs_inputs_and_stats(tmp_path):
    found = stage_dir(tmp_path, n=2, per=2)
    out = tmp_path / "out"
    stats = Stats()
    stats.extra["seen_by_test"] = 5
    run_stage("upper", found, str(out), upper, {"k": [1, 2]}, stats)
    m = manifest(out)
    assert m["stage"] == "upper" and m["complete"] is True
    assert m["config"] == {"k": [1, 2]} and m["config_digest"] == content_hash({"k": [1, 2]})
    assert isinstance(m["spade_version"], str) and m["spade_version"]
    assert sorted(m["shards"]) == ["00000", "00001"]
    entry = m["shards"]["00001"]
    assert entry["input"] == found[1].path and entry["input_hash"] == found[1].digest()
    assert entry["outputs"] == {"design-00001.jsonl": 2}
    assert entry["provenance"]["spade_version"] == m["spade_version"]
    assert m["stats"]["read"] == 4 and m["stats"]["written"] == {"design": 4}
    assert m["stats"]["seen_by_test"] == 5 and m["stats"]["skipped_shards"] == 0
    assert (out / MANIFEST).read_bytes().endswith(b"}\n")


def test_a_shard_with_several_kinds_writes_one_file_per_kind_with_the_suffix(tmp_path):
    source = Shard("<m>", 3, tuple(designs(2)) + (env_record(),))
    out = tmp_path / "out"
    run_stage("t", [source], str(out), kept, {}, Stats(), suffix=".jsonl.gz")
    assert sorted(os.listdir(out)) == [MANIFEST, "design-00003.jsonl.gz", "env-00003.jsonl.gz"]
    assert manifest(out)["shards"]["00003"]["outputs"] == {"design-00003.jsonl.gz": 2,
                                                           "env-00003.jsonl.gz": 1}


def test_a_shard_that_produced_nothing_is_still_finished_and_skipped_on_rerun(tmp_path):
    found = stage_dir(tmp_path, n=1)
    out = str(tmp_path / "out")
    run_stage("drop", found, out, lambda records: iter(()), {}, Stats())
    assert manifest(out)["shards"]["00000"]["outputs"] == {}
    stats = Stats()
    run_stage("drop", found, out, lambda records: iter(()), {}, stats)
    assert stats.skipped_shards == 1


def test_a_rerun_redoes_a_shard_whose_output_is_gone(tmp_path):
    found = stage_dir(tmp_path, n=2)
    out = tmp_path / "out"
    run_stage("upper", found, str(out), upper, {}, Stats())
    (out / "design-00000.jsonl").unlink()
    stats = Stats()
    run_stage("upper", found, str(out), upper, {}, stats)
    assert stats.skipped_shards == 1 and stats.written == {"design": 1}
    assert [r.completion for r in read([str(out)])] == ["ANSWER 0", "ANSWER 1"]


def test_overwrite_redoes_every_shard(tmp_path):
    found = stage_dir(tmp_path, n=2)
    out = str(tmp_path / "out")
    run_stage("upper", found, out, upper, {}, Stats())
    stats = Stats()
    run_stage("upper", found, out, upper, {}, stats, overwrite=True)
    assert stats.skipped_shards == 0 and stats.written == {"design": 2}
    assert manifest(out)["complete"] is True


@pytest.mark.parametrize("damage", [b"{not json", b"", b"[]"])
def test_an_unreadable_or_empty_manifest_means_redo_everything(tmp_path, damage):
    found = stage_dir(tmp_path, n=2)
    out = tmp_path / "out"
    run_stage("upper", found, str(out), upper, {}, Stats())
    if damage == b"[]":
        # a manifest of another config: nothing it lists is reused
        run_stage("upper", found, str(out), upper, {"other": 1}, Stats())
        stats = Stats()
        run_stage("upper", found, str(out), upper, {}, stats)
        assert stats.skipped_shards == 0
        return
    (out / MANIFEST).write_bytes(damage)
    stats = Stats()
    run_stage("upper", found, str(out), upper, {}, stats)
    assert stats.skipped_shards == 0 and stats.written == {"design": 2}


def test_a_manifest_of_another_shard_index_or_input_is_not_reused(tmp_path):
    found = stage_dir(tmp_path, n=1)
    out = str(tmp_path / "out")
    run_stage("upper", found, out, upper, {}, Stats())
    moved = [Shard(found[0].path, 1)]  # the same file at another index
    stats = Stats()
    run_stage("upper", moved, out, upper, {}, stats)
    assert stats.skipped_shards == 0
    assert sorted(manifest(out)["shards"]) == ["00001"]  # only this run's shards are listed


def test_records_from_stdin_are_never_skipped_on_rerun(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    data = b"".join(dumps(d) for d in designs(2))
    for _ in range(2):
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
        stats = Stats()
        run_stage("upper", find_shards(["-"]), out, upper, {}, stats)
        assert stats.skipped_shards == 0 and stats.written == {"design": 2}
    assert manifest(out)["shards"]["00000"]["input_hash"] is None
    assert manifest(out)["shards"]["00000"]["input"] == "-"


def test_the_manifest_says_incomplete_until_the_last_shard_is_written(tmp_path):
    found = stage_dir(tmp_path, n=3)
    out = tmp_path / "out"
    seen = []

    def watch(records):
        for record in upper(records):
            if (out / MANIFEST).exists():
                seen.append((record.completion, manifest(out)["complete"],
                             sorted(manifest(out)["shards"])))
            yield record

    run_stage("upper", found, str(out), watch, {}, Stats())
    assert seen == [("ANSWER 1", False, ["00000"]), ("ANSWER 2", False, ["00000", "00001"])]
    assert manifest(out)["complete"] is True


def test_emit_writes_one_shard_numbered_zero(tmp_path):
    out = tmp_path / "out"
    stats = Stats()
    emit("seeds", str(out), lambda _journal: iter(designs(3)), {"n": 3}, stats)
    assert sorted(os.listdir(out)) == [MANIFEST, "design-00000.jsonl"]
    assert stats.written == {"design": 3} and stats.read == 0
    assert manifest(out)["shards"]["00000"]["input"] == "<generated>"


def test_an_emitting_stage_resumes_unless_told_to_overwrite(tmp_path):
    out = str(tmp_path / "out")
    emit("seeds", out, lambda _journal: iter(designs(2)), {}, Stats())
    again = Stats()
    emit("seeds", out, lambda _journal: iter(designs(2)), {}, again)
    assert again.skipped_shards == 1 and again.written == {}
    forced = Stats()
    emit("seeds", out, lambda _journal: iter(designs(3)), {}, forced, overwrite=True)
    assert forced.skipped_shards == 0 and forced.written == {"design": 3}
    emit("seeds", str(tmp_path / "gz"), lambda _journal: iter(designs(1)), {}, Stats(),
         suffix=".jsonl.zst")
    assert sorted(os.listdir(tmp_path / "gz")) == [MANIFEST, "design-00000.jsonl.zst"]


# -- kinds, repeats and the summary counters -----------------------------------------------------

def test_a_shard_with_none_of_the_kinds_a_stage_reads_names_what_it_held(tmp_path):
    path = tmp_path / "mixed.jsonl"
    write_shard(path, [env_record("a"), env_record("b"), Design(completion="x").model_copy()][:2])
    with pytest.raises(RecordError) as raised:
        run_stage("t", find_shards([str(path)]), str(tmp_path / "o.jsonl"), kept, {}, Stats(),
                  kinds={"rollout", "design"})
    assert str(raised.value) == f"{path}: no design or rollout records, only 2 env"


def test_the_kinds_a_shard_held_instead_are_listed_most_common_first(tmp_path):
    from stages.records import Memory
    path = tmp_path / "mixed.jsonl"
    write_shard(path, [Memory(env_id="m1"), env_record("a"), env_record("b")])
    with pytest.raises(RecordError) as raised:
        run_stage("t", find_shards([str(path)]), str(tmp_path / "o.jsonl"), kept, {}, Stats(),
                  kinds={"design"})
    assert str(raised.value) == f"{path}: no design records, only 2 env, 1 memory"


def test_records_of_other_kinds_pass_by_when_the_shard_has_some_of_the_stages(tmp_path):
    source = Shard("<m>", 0, (env_record("a"),) + tuple(designs(2)) + (env_record("b"),))
    stats = Stats()
    run_stage("t", [source], str(tmp_path / "o.jsonl"), kept, {}, stats, kinds={"design"})
    assert [r.kind for r in read([str(tmp_path / "o.jsonl")])] == ["design", "design"]
    assert stats.read == 2 and stats.duplicates == 0


def test_a_shard_of_only_other_kinds_from_stdin_is_named_stdin(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(dumps(env_record()))))
    with pytest.raises(RecordError, match=r"^<stdin>: no design records, only 1 env$"):
        run_stage("t", find_shards(["-"]), str(tmp_path / "o.jsonl"), kept, {}, Stats(),
                  kinds={"design"})


def test_an_empty_shard_is_not_an_error(tmp_path):
    path = tmp_path / "design-00000.jsonl"
    path.write_bytes(b"")
    stats = Stats()
    run_stage("t", find_shards([str(path)]), str(tmp_path / "o.jsonl"), kept, {}, stats,
              kinds={"design"})
    assert stats.read == 0


def test_the_summary_counts_reads_writes_repeats_and_extra(tmp_path):
    one, two = designs(2)
    stats = Stats()
    assert stats.first(one) and stats.first(two)
    assert not stats.first(one) and not stats.first(one)
    assert stats.duplicates == 2 and stats.repeated() == [("design", one.id, 3)]
    stats.read, stats.skipped_shards = 4, 1
    stats.written["design"] += 2
    stats.reasons["bad"] += 1
    stats.extra["cut"] = 7
    d = stats.as_dict()
    assert list(d) == ["read", "written", "reasons", "skipped_shards", "duplicates", "cut",
                       "seconds"]
    assert (d["read"], d["written"], d["reasons"], d["skipped_shards"], d["duplicates"],
            d["cut"]) == (4, {"design": 2}, {"bad": 1}, 1, 2, 7)
    assert 0 <= d["seconds"] < 60 and round(d["seconds"], 3) == d["seconds"]
    assert Stats().as_dict()["duplicates"] == 0 and Stats().repeated() == []


def peak_mb(call):
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 1e6


def test_an_inputs_digest_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"y" * (24 << 20))
    digests = []
    assert peak_mb(lambda: digests.append(Shard(str(path), 0).digest())) < 8
    assert digests == [hashlib.sha256(path.read_bytes()).hexdigest()]


def random_records(n=160, chars=16000):
    rng = random.Random(0)
    return [Design(completion=f"{i} " + rng.randbytes(chars // 2).hex()) for i in range(n)]


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_shard_of_several_compressed_chunks_reads_whole_and_a_chunk_at_a_time(tmp_path,
                                                                              suffix):
    records = random_records()
    path = tmp_path / f"design-00000{suffix}"
    write_shard(path, records)
    assert path.stat().st_size > shards.CHUNK  # hex digits: about half the 2.5 MB text
    assert [r.completion for r in read([str(path)])] == [r.completion for r in records]


def test_a_big_zstd_shard_is_not_read_whole_before_its_first_line(tmp_path, monkeypatch):
    path = tmp_path / "design-00000.jsonl.zst"
    write_atomic(path, [b"f" * 100 + random.Random(1).randbytes(8 << 20).hex().encode() + b"\n"])
    assert path.stat().st_size > 6 << 20
    monkeypatch.setenv(MAX_LINE_ENV, str(1 << 20))

    def cut():
        with pytest.raises(RecordError, match="a line longer than 1048576 bytes"):
            list(read_shard(str(path)))

    assert peak_mb(cut) < 12  # whole, it would be 8 MB read and 16 MB unpacked


def test_the_temp_file_is_hidden_beside_the_final_one_while_it_is_written(tmp_path):
    seen = []

    def lines():
        yield b"a\n"
        seen.extend(os.listdir(tmp_path))
        yield b"b\n"

    write_atomic(tmp_path / "design-00000.jsonl", lines())
    assert len(seen) == 1
    assert re.fullmatch(r"\.design-00000\.jsonl\.[0-9a-f]{16}\.tmp", seen[0]), seen
    assert os.listdir(tmp_path) == ["design-00000.jsonl"]


def vanish(tmp_path):
    for name in os.listdir(tmp_path):
        if name.endswith(".tmp"):
            os.unlink(tmp_path / name)


def test_an_error_after_the_temp_file_vanished_is_still_the_error_itself(tmp_path, monkeypatch):
    # someone cleaned the output dir mid-write (`rm -rf`): the stage reports its own error
    def killed():
        yield b"a\n"
        vanish(tmp_path)
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        write_atomic(tmp_path / "x.jsonl", killed())

    def upstream():
        yield b"a\n"
        vanish(tmp_path)
        raise FileNotFoundError(errno.ENOENT, "input gone")

    with pytest.raises(FileNotFoundError, match="input gone"):
        write_atomic(tmp_path / "x.jsonl", upstream())

    def full(src, dst):
        vanish(tmp_path)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OutputError) as raised:
        write_atomic(tmp_path / "x.jsonl", [b"a\n"])
    monkeypatch.undo()
    assert raised.value.code == 74
    assert os.listdir(tmp_path) == []


def test_reading_with_kinds_refuses_a_record_of_another_kind_at_its_line(tmp_path):
    path = tmp_path / "design-00000.jsonl"
    write_shard(path, designs(1) + [env_record()])
    with pytest.raises(RecordError) as raised:
        list(read([str(path)], {"design"}))
    assert str(raised.value) == f"{path}:2: field 'kind': expected design, got 'env'"
    with pytest.raises(RecordError, match=rf"^{path}:2: field 'kind'"):
        list(read_shard(str(path), {"design"}))
    assert len(list(read([str(path)]))) == 2
    # a directory read with kinds lends only their files
    (tmp_path / "env-00000.jsonl").write_bytes(dumps(env_record()))
    (tmp_path / "design-00000.jsonl").write_bytes(dumps(designs(1)[0]))
    assert [r.kind for r in read([str(tmp_path)], {"design"})] == ["design"]


def test_a_judging_stages_manifest_entries_carry_its_provenance(tmp_path):
    config = {"window": 3, "variant": "blend"}
    out = tmp_path / "out"
    emit("score-regret", str(out), lambda _journal: iter(designs(1)), config, Stats())
    m = manifest(out)
    assert m["shards"]["00000"]["provenance"] == provenance.stamp("score-regret", config)
    assert "reward" in m["shards"]["00000"]["provenance"]
    assert m["stage"] == "score-regret" and m["config"] == config


def test_the_manifest_is_indented_for_people_to_read(tmp_path):
    emit("t", str(tmp_path / "out"), lambda _journal: iter(designs(1)), {}, Stats())
    text = (tmp_path / "out" / MANIFEST).read_text()
    assert text.startswith('{\n  "stage": "t"') and text.count("\n") > 10


def test_a_manifest_of_this_config_without_a_shard_list_means_redo_everything(tmp_path):
    found = stage_dir(tmp_path, n=1)
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_bytes(orjson.dumps({"config_digest": content_hash({})}))
    stats = Stats()
    run_stage("upper", found, str(out), upper, {}, stats)
    assert stats.skipped_shards == 0 and stats.written == {"design": 1}


def test_the_summary_seconds_are_the_time_since_start_to_the_millisecond():
    stats = Stats()
    stats.started = time.monotonic() - 1.23456
    seconds = stats.as_dict()["seconds"]
    assert isinstance(seconds, float) and 1.234 < seconds < 2
    assert round(seconds, 3) == seconds


def test_an_emitting_stage_stopped_midway_gets_back_what_it_had_made(tmp_path):
    """The journal: each kept record survives a stop; a cut-off last line (a kill mid-write) is
    not one; once the output is written the journal is gone."""
    out = tmp_path / "out"
    made = designs(3)

    def stops_after_two(journal):
        for record in made[:2]:
            journal.keep(record)
            yield record
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        emit("seeds", str(out), stops_after_two, {"n": 3}, Stats())
    [journal] = out.glob("_journal-*.jsonl")
    with open(journal, "ab") as fh:
        fh.write(dumps(made[2])[:40])  # the kill came in the middle of the third line
    seen = []

    def resumes(journal):
        seen.extend(journal.made)
        yield from made

    emit("seeds", str(out), resumes, {"n": 3}, Stats())
    assert [r.id for r in seen] == [r.id for r in made[:2]]
    assert len((out / "design-00000.jsonl").read_bytes().splitlines()) == 3
    assert not list(out.glob("_journal-*"))


def test_a_journal_of_another_config_or_an_overwrite_is_not_resumed(tmp_path):
    out = tmp_path / "out"

    def stops(journal):
        journal.keep(designs(1)[0])
        raise KeyboardInterrupt
        yield

    def made_before(journal):
        seen.append(len(journal.made))
        return iter(designs(1))

    for config, overwrite in (({"n": 2}, False), ({"n": 1}, True)):
        with pytest.raises(KeyboardInterrupt):
            emit("seeds", str(out), stops, {"n": 1}, Stats())
        seen = []
        taken_back = emit("seeds", str(out), made_before, config, Stats(), overwrite=overwrite)
        assert taken_back == 0 and seen == [0] and not list(out.glob("_journal-*"))
    assert emit("seeds", "-", made_before, {}, Stats()) == 0 and seen == [0, 0]
