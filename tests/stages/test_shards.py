"""Shards: reading by suffix, path:line errors, atomic writes, manifests and resume."""

import gzip
import io
import os
import re
from pathlib import Path

import orjson
import pytest

from stages.records import Design, RecordError, dumps
from stages.shards import (MANIFEST, InputMissing, Shard, Stats, find_shards, read, run_stage,
                           unique, write_atomic)


def designs(n, start=0):
    return [Design(completion=f"answer {i}") for i in range(start, start + n)]


def write_shard(path, records):
    write_atomic(path, [dumps(r) for r in records])


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_write_then_read_every_suffix(tmp_path, suffix):
    path = tmp_path / f"design-00000{suffix}"
    write_shard(path, designs(3))
    assert [r.completion for r in read([str(path)])] == ["answer 0", "answer 1", "answer 2"]
    if suffix == ".jsonl.gz":
        assert gzip.open(path).read().count(b"\n") == 3


def test_directory_lists_shards_in_order_and_ignores_manifest_and_temp(tmp_path):
    for name in ("design-00001.jsonl", "design-00000.jsonl"):
        write_shard(tmp_path / name, designs(1))
    (tmp_path / MANIFEST).write_text("{}")
    (tmp_path / ".design-00002.jsonl.abc.tmp").write_text("torn")
    assert [Path(s.path).name for s in find_shards([str(tmp_path)])] == [
        "design-00000.jsonl", "design-00001.jsonl"]


def test_missing_input_is_its_own_error(tmp_path):
    with pytest.raises(InputMissing, match="no such file"):
        find_shards([str(tmp_path / "nope.jsonl")])


def test_bad_json_line_names_path_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(dumps(designs(1)[0]) + b"\n{not json\n")
    with pytest.raises(RecordError, match=rf"^{path}:3: invalid JSON"):
        list(read([str(path)]))


def test_bad_field_names_path_line_and_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"kind":"design","v":1,"slot":"first"}\n')
    with pytest.raises(RecordError, match=rf"^{path}:1: field 'slot': "):
        list(read([str(path)]))


def test_atomic_write_leaves_no_file_when_interrupted(tmp_path):
    def lines():
        yield dumps(designs(1)[0])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "out.jsonl", lines())
    assert os.listdir(tmp_path) == []


def upper(records):
    for record in records:  # new content, so a new record (a copy would keep the old id)
        yield Design(completion=record.completion.upper())


def test_directory_output_writes_shards_and_manifest_last(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_shard(inputs / "design-00000.jsonl", designs(2))
    write_shard(inputs / "design-00001.jsonl", designs(1, start=2))
    out = tmp_path / "out"
    stats = Stats()
    run_stage("upper", find_shards([str(inputs)]), str(out), upper, {"k": 1}, stats)
    assert sorted(os.listdir(out)) == [MANIFEST, "design-00000.jsonl", "design-00001.jsonl"]
    manifest = orjson.loads((out / MANIFEST).read_bytes())
    assert manifest["complete"] is True
    assert manifest["shards"]["00000"]["outputs"] == {"design-00000.jsonl": 2}
    assert [r.completion for r in read([str(out)])] == ["ANSWER 0", "ANSWER 1", "ANSWER 2"]
    assert stats.written["design"] == 3


def test_rerun_skips_finished_shards_and_redoes_changed_ones(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_shard(inputs / "design-00000.jsonl", designs(2))
    write_shard(inputs / "design-00001.jsonl", designs(1, start=2))
    out = str(tmp_path / "out")
    run_stage("upper", find_shards([str(inputs)]), out, upper, {}, Stats())

    seen = []

    def spy(records):
        for record in upper(records):
            seen.append(record.completion)
            yield record

    stats = Stats()
    run_stage("upper", find_shards([str(inputs)]), out, spy, {}, stats)
    assert seen == [] and stats.skipped_shards == 2

    write_shard(inputs / "design-00001.jsonl", designs(1, start=7))
    run_stage("upper", find_shards([str(inputs)]), out, spy, {}, Stats())
    assert seen == ["ANSWER 7"]

    run_stage("upper", find_shards([str(inputs)]), out, spy, {"changed": True}, Stats())
    assert seen == ["ANSWER 7", "ANSWER 0", "ANSWER 1", "ANSWER 7"]


def test_crash_mid_run_then_rerun_writes_only_missing_shards(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for index in range(3):
        write_shard(inputs / f"design-{index:05d}.jsonl", designs(1, start=index))
    out = tmp_path / "out"

    def crash_on_third(records):
        for record in upper(records):
            if record.completion == "ANSWER 2":
                raise RuntimeError("boom")
            yield record

    with pytest.raises(RuntimeError):
        run_stage("upper", find_shards([str(inputs)]), str(out), crash_on_third, {}, Stats())
    assert sorted(p for p in os.listdir(out) if not p.startswith("_")) == [
        "design-00000.jsonl", "design-00001.jsonl"]
    assert orjson.loads((out / MANIFEST).read_bytes())["complete"] is False

    stats = Stats()
    run_stage("upper", find_shards([str(inputs)]), str(out), upper, {}, stats)
    assert stats.skipped_shards == 2 and stats.written["design"] == 1
    assert orjson.loads((out / MANIFEST).read_bytes())["complete"] is True


def test_in_memory_shard_reads_its_records():
    shard = Shard(path="mem", index=0, records=tuple(designs(2)))
    assert [r.completion for r in read_records(shard)] == ["answer 0", "answer 1"]
    assert shard.digest() == Shard(path="other", index=3, records=tuple(designs(2))).digest()


def read_records(shard):
    from stages.shards import read_shard

    return list(read_shard(shard))


def test_file_output_writes_one_file_atomically(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_shard(inputs / "design-00000.jsonl", designs(2))
    write_shard(inputs / "design-00001.jsonl", designs(1, start=2))
    out = tmp_path / "sub" / "all.jsonl.gz"
    run_stage("upper", find_shards([str(inputs)]), str(out), upper, {}, Stats())
    assert [r.completion for r in read([str(out)])] == ["ANSWER 0", "ANSWER 1", "ANSWER 2"]
    assert sorted(os.listdir(out.parent)) == ["all.jsonl.gz"]


def test_nan_strings_in_a_rollout_shard_are_refused_with_path_line_and_field(tmp_path):
    path = tmp_path / "rollout-00000.jsonl"
    good = b'{"kind":"rollout","env_id":"env_x","turns":[{"action":"a","logprobs":[-0.5]}]}\n'
    path.write_bytes(good + good.replace(b"[-0.5]", b'[-0.5,"NaN"]'))
    with pytest.raises(RecordError, match=rf"^{path}:2: field 'turns\.0\.logprobs\.1': expected "
                                          r"a finite JSON number, got 'NaN'"):
        list(read([str(path)]))


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_non_finite_json_tokens_are_invalid_json(tmp_path, token):
    path = tmp_path / "rollout-00000.jsonl"
    path.write_bytes(b'{"kind":"rollout","env_id":"env_x","reward":' + token + b"}\n")
    with pytest.raises(RecordError, match=rf"^{path}:1: invalid JSON"):
        list(read([str(path)]))


def compressed(tmp_path, suffix, n=200):
    path = tmp_path / f"design-00000{suffix}"
    write_shard(path, [Design(completion=f"answer {i} " * 20) for i in range(n)])
    return path.read_bytes()


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
@pytest.mark.parametrize("damage", ["cut in half", "last byte cut", "not compressed",
                                    "garbage after the end"])
def test_a_damaged_compressed_shard_is_an_error_naming_the_file(tmp_path, suffix, damage):
    data = compressed(tmp_path, suffix)
    damaged = {"cut in half": data[:len(data) // 2], "last byte cut": data[:-1],
               "not compressed": b'{"kind":"design"}\n',
               "garbage after the end": data + b"\x01garbage"}[damage]
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(damaged)
    kind = "gzip" if suffix.endswith("gz") else "zstd"
    with pytest.raises(RecordError, match=rf"^{path}: not a complete {kind} file"):
        list(read([str(path)]))


def test_a_cut_off_zstd_shard_stops_the_stage_before_its_manifest_says_complete(tmp_path):
    data = compressed(tmp_path, ".jsonl.zst")
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "design-00000.jsonl.zst").write_bytes(data[:len(data) // 2])
    out = tmp_path / "out"
    with pytest.raises(RecordError, match="not a complete zstd file"):
        run_stage("upper", find_shards([str(inputs)]), str(out), upper, {}, Stats())
    manifest = out / MANIFEST
    assert not manifest.exists() or orjson.loads(manifest.read_bytes())["complete"] is False


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_concatenated_members_and_frames_read_as_one_shard(tmp_path, suffix):
    first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    write_shard(first, designs(2))
    write_shard(second, designs(1, start=2))
    both = tmp_path / f"design-00000{suffix}"
    both.write_bytes(first.read_bytes() + second.read_bytes())
    assert [r.completion for r in read([str(both)])] == ["answer 0", "answer 1", "answer 2"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_shards_and_manifests_get_the_mode_the_umask_gives(tmp_path, umask):
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_shard(inputs / "design-00000.jsonl", designs(1))
    previous = os.umask(umask)
    try:
        run_stage("upper", find_shards([str(inputs)]), str(tmp_path / "out"), upper, {}, Stats())
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert modes == {"design-00000.jsonl": 0o666 & ~umask, MANIFEST: 0o666 & ~umask}


def forged_design_lines():
    """Line 1 a design, line 2 another design's content under line 1's id."""
    first, other = designs(2)
    forged = {**orjson.loads(dumps(other)), "id": first.id}
    return dumps(first) + orjson.dumps(forged) + b"\n", other.id, first.id


def test_a_record_whose_id_is_not_its_contents_stops_reading_at_its_line(tmp_path, monkeypatch):
    data, expected, got = forged_design_lines()
    message = f"id does not match its content (expected {expected}, got {got})"
    path = tmp_path / "design-00000.jsonl.gz"
    path.write_bytes(gzip.compress(data))
    with pytest.raises(RecordError, match=re.escape(f"{path}:2: {message}")):
        list(read([str(path)]))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    with pytest.raises(RecordError, match=re.escape(f"<stdin>:2: {message}")):
        list(read(["-"]))


def kept(records):
    yield from records


def test_a_stage_uses_a_record_repeated_across_its_inputs_once(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    one, two = designs(2)
    write_shard(inputs / "design-00000.jsonl", [one, two, one])
    write_shard(inputs / "design-00001.jsonl", [two])
    stats = Stats()
    run_stage("keep", find_shards([str(inputs)]), str(tmp_path / "out.jsonl"), kept, {}, stats,
              kinds={"design"})
    assert [r.id for r in read([str(tmp_path / "out.jsonl")])] == [one.id, two.id]
    assert stats.read == 2 and stats.duplicates == 2 and stats.as_dict()["duplicates"] == 2
    assert stats.repeated() == [("design", one.id, 2), ("design", two.id, 2)]
    assert [r.id for r in unique([one, two, one], Stats())] == [one.id, two.id]


def test_a_rerun_remembers_what_the_shards_it_skips_held(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    one, two = designs(2)
    write_shard(inputs / "design-00000.jsonl", [one])
    write_shard(inputs / "design-00001.jsonl", [one, two])
    out = tmp_path / "out"
    run_stage("keep", find_shards([str(inputs)]), str(out), kept, {}, Stats(), kinds={"design"})
    (out / "design-00001.jsonl").unlink()  # the second shard is redone, the first skipped
    stats = Stats()
    run_stage("keep", find_shards([str(inputs)]), str(out), kept, {}, stats, kinds={"design"})
    assert stats.skipped_shards == 1 and stats.duplicates == 1
    assert [r.id for r in read([str(out / "design-00001.jsonl")])] == [two.id]


def test_remove_temp_files_clears_what_a_killed_writer_left_and_nothing_else(tmp_path):
    from stages.shards import remove_temp_files

    shard_dir = tmp_path / "r00" / "hint"
    shard_dir.mkdir(parents=True)
    left = [shard_dir / "._manifest.json.0123456789abcdef.tmp",
            tmp_path / ".recipe.json.fedcba9876543210.tmp"]
    kept = [shard_dir / "env-00000.jsonl", shard_dir / "_manifest.json",
            shard_dir / ".notes.tmp", tmp_path / "step-000002.tmp"]
    for path in left + kept:
        path.write_text("x")
    assert remove_temp_files(tmp_path) == 2
    assert [p.exists() for p in left] == [False, False]
    assert all(p.exists() for p in kept)
