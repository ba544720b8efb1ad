"""Hostile input through the real command under a 1 GiB address-space limit: each case is one
line and a documented exit code, never a process killed for memory (issue 19's bounded input)."""

import gzip
import os
import resource
import subprocess
import sys

import orjson
import pytest

MEMORY_LIMIT = 1 << 30  # the default line cap (64 MiB) and the source cap fit well inside it


def spade_validate(*args):
    def limit_memory():  # the soft limit only: nsjail may still set its own for the jail
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, resource.RLIM_INFINITY))

    return subprocess.run([sys.executable, "-m", "spade_cli", "validate", "--allow-all-rejected",
                           *args], capture_output=True, text=True, timeout=300,
                          preexec_fn=limit_memory)


def design_shard(path, completion):
    line = {"kind": "design", "v": 1, "domain": "game", "completion": completion}
    path.write_bytes(orjson.dumps(line) + b"\n")
    return str(path)


def test_dev_zero_as_a_shard_is_exit_65():
    done = spade_validate("/dev/zero")
    assert done.returncode == 65, done.stderr
    assert done.stderr.strip().splitlines() == [
        "spade validate: error: /dev/zero:1: a line longer than 67108864 bytes (set "
        "SPADE_MAX_LINE_BYTES to read longer ones)"]


def test_a_gzip_bomb_is_exit_65(tmp_path):
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:  # 256 MiB of one line
        block = b"0" * (1 << 20)
        for _ in range(256):
            fh.write(block)
    done = spade_validate(str(path))
    assert done.returncode == 65, done.stderr
    assert f"{path}:1: a line longer than 67108864 bytes" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.usefixtures("nsjail_ok")
@pytest.mark.parametrize("program, check, reason", [
    ("x = 1\n" * 8_000_000, "extract", "the env's source is 48000000 bytes, more than the 262144"),
    ("x = " + "-" * 100_000 + "1\n", "parse", "the source nests too deeply for Python's parser"),
], ids=["48 MB", "100k deep"])
def test_a_huge_or_deep_design_is_a_reject(tmp_path, program, check, reason):
    done = spade_validate(design_shard(tmp_path / "design-00000.jsonl",
                                       f"```python\n{program}```"))
    assert done.returncode == 0, done.stderr
    verdict = orjson.loads(done.stdout)
    assert verdict["kind"] == "validation" and verdict["error"]["type"] == check
    assert verdict["error"]["msg"].startswith(reason)
    assert f"1 rejected ({check} 1)" in done.stderr


def test_the_limit_is_real():
    # The cases above mean something only if the child cannot take more than the limit.
    done = subprocess.run([sys.executable, "-c", "bytearray(2 << 30)"], capture_output=True,
                          preexec_fn=lambda: resource.setrlimit(
                              resource.RLIMIT_AS, (MEMORY_LIMIT, resource.RLIM_INFINITY)),
                          env={**os.environ}, timeout=60)
    assert done.returncode != 0 and b"MemoryError" in done.stderr
