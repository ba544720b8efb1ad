"""Bounded input and output: an over-long shard line is exit 65 naming file and line with flat
memory; an output that cannot be written is one line and exit 73 (cannot create) or 74 (disk
full), with nothing partial left."""

import errno
import gzip
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from spade_cli.errors import exit_code_for
from stages import shards
from stages.records import Design, RecordError
from stages.shards import OutputError, Stats, read_shard, run_stage, write_atomic

LINE = b'{"kind": "design", "v": 1, "domain": "game", "completion": "x"}\n'


def test_a_line_over_the_cap_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv(shards.MAX_LINE_ENV, "1000")
    path = tmp_path / "design-00000.jsonl"
    path.write_bytes(LINE + b"x" * 5000 + b"\n")
    with pytest.raises(RecordError) as raised:
        list(read_shard(str(path)))
    assert str(raised.value).startswith(f"{path}:2: a line longer than 1000 bytes")
    assert exit_code_for(raised.value) == 65


def test_a_line_exactly_at_the_cap_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv(shards.MAX_LINE_ENV, str(len(LINE) - 1))  # the newline is not counted
    path = tmp_path / "d.jsonl"
    path.write_bytes(LINE + LINE.rstrip(b"\n"))
    assert len(list(read_shard(str(path)))) == 2


def test_a_bad_cap_is_a_data_error(monkeypatch, tmp_path):
    monkeypatch.setenv(shards.MAX_LINE_ENV, "lots")
    (tmp_path / "d.jsonl").write_bytes(LINE)
    with pytest.raises(RecordError, match="SPADE_MAX_LINE_BYTES must be a positive"):
        list(read_shard(str(tmp_path / "d.jsonl")))


def peak_mb(call):
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 1e6


def test_a_200_mb_line_under_a_1_mb_cap_reads_in_flat_memory(tmp_path, monkeypatch):
    monkeypatch.setenv(shards.MAX_LINE_ENV, str(1 << 20))
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        block = b"x" * (1 << 20)
        for _ in range(200):
            fh.write(block)

    def read():
        with pytest.raises(RecordError, match=r"big.jsonl:1: a line longer than 1048576 bytes"):
            list(read_shard(str(path)))

    assert peak_mb(read) < 5


def test_dev_zero_is_refused_at_the_cap(monkeypatch):
    monkeypatch.setenv(shards.MAX_LINE_ENV, str(1 << 20))

    def read():
        with pytest.raises(RecordError, match=r"/dev/zero:1: a line longer than"):
            list(read_shard("/dev/zero"))

    assert peak_mb(read) < 5


def test_a_gzip_bomb_is_refused_in_flat_memory(tmp_path, monkeypatch):
    monkeypatch.setenv(shards.MAX_LINE_ENV, str(1 << 20))
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb") as fh:  # 200 MB of one line in about 200 KB
        block = b"0" * (1 << 20)
        for _ in range(200):
            fh.write(block)
    assert path.stat().st_size < 1 << 20

    def read():
        with pytest.raises(RecordError, match=r"bomb.jsonl.gz:1: a line longer than"):
            list(read_shard(str(path)))

    assert peak_mb(read) < 12


def test_the_cli_exits_65_naming_the_file(tmp_path):
    path = tmp_path / "design-00000.jsonl"
    path.write_bytes(b"y" * 3000)
    done = subprocess.run([sys.executable, "-m", "spade_cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, shards.MAX_LINE_ENV: "1000"})
    assert done.returncode == 65, done.stderr
    assert f"{path}:1: a line longer than 1000 bytes" in done.stderr
    assert "Traceback" not in done.stderr


# -- outputs -----------------------------------------------------------------------------------

def designs(n=3):
    return [Design(domain="game", completion=f"c{i}") for i in range(n)]


def stage_to(out):
    source = shards.Shard(path="<mem>", index=0, records=tuple(designs()))
    run_stage("test", [source], str(out), lambda records: records, {}, Stats())


def test_a_full_disk_is_exit_74_and_leaves_nothing(tmp_path, monkeypatch):
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError) as raised:
        stage_to(tmp_path / "out")
    monkeypatch.setattr(os, "fsync", real)
    assert raised.value.code == 74 and exit_code_for(raised.value) == 74
    assert "No space left on device" in str(raised.value) and "\n" not in str(raised.value)
    assert [p.name for p in (tmp_path / "out").iterdir()] == []


def test_a_full_disk_while_writing_lines_is_exit_74(tmp_path, monkeypatch):
    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gzip.GzipFile, "write", full)
    with pytest.raises(OutputError) as raised:
        write_atomic(tmp_path / "x.jsonl.gz", [b"a\n", b"b\n"])
    monkeypatch.undo()
    assert raised.value.code == 74
    assert list(tmp_path.iterdir()) == []


def test_an_input_error_while_writing_is_not_an_output_error(tmp_path):
    def lines():
        yield b"a\n"
        raise FileNotFoundError(errno.ENOENT, "gone")

    with pytest.raises(FileNotFoundError) as raised:
        write_atomic(tmp_path / "x.jsonl", lines())
    assert not isinstance(raised.value, OutputError)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only dir anyway")
def test_a_read_only_dir_is_exit_73(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    try:
        with pytest.raises(OutputError) as raised:
            stage_to(out)
    finally:
        out.chmod(0o755)
    assert raised.value.code == 73


def test_an_unwritable_dir_is_exit_73(tmp_path, monkeypatch, refuse_temp_files):
    refuse_temp_files(errno.EROFS)
    with pytest.raises(OutputError) as raised:
        stage_to(tmp_path / "out")
    monkeypatch.undo()
    assert raised.value.code == 73 and "Read-only file system" in str(raised.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_a_dangling_symlink_as_out_dir_is_exit_73_in_one_line(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputError) as raised:
        stage_to(link)
    assert raised.value.code == 73
    assert str(raised.value) == (f"{link}: cannot write the output: it is a symlink to "
                                 f"{tmp_path / 'nowhere'}, which does not exist")


def test_the_cli_prints_one_line_for_a_dangling_symlink(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    env_file = Path(__file__).parent.parent / "fixtures" / "validate" / "broken" / "parse.py"
    done = subprocess.run([sys.executable, "-m", "spade_cli", "validate", str(env_file), "-o",
                           str(link)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 73, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{link}: cannot write the output: it is a symlink" in done.stderr
