"""Input shards for a stage command, saying what it leaves out.

In: the paths a user gave, the record kinds the command reads and a phrase for them. Out: the
shards to read (stages.shards.find_shards). Guarantees: shard files of other kinds in a named
directory are never ignored in silence: when they are all there is, the command stops with
exit 65 (`rollout-dir: skipped 64 rollout records: validate reads design records and .py files`);
beside shards it reads, one INFO line says what was left out. Before anything is read: `-`
(stdin) with a terminal there is a usage error (exit 2) saying what the command reads, not a
silent wait; a `.py` file is Python source, not a shard (exit 65, pointing at `spade validate`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from pathlib import Path

from stages.records import MODELS, RecordError
from stages.shards import SUFFIXES, Shard, find_shards, open_text

log = logging.getLogger("spade.inputs")


def find_inputs(command: str, inputs: list[str], kinds: set[str], reads: str,
                others: bool = False) -> list[Shard]:
    """`reads`: what the command reads, for the message (`design records and .py files`);
    `others`: the command has inputs besides these shards, so finding none is no error."""
    check_sources(command, inputs, kinds, reads)
    shards = find_shards(inputs, kinds)
    skipped, where = Counter(), []
    for item in inputs:
        if item != "-" and os.path.isdir(item):
            found = other_kinds(Path(item), kinds)
            skipped.update(found)
            where += [item] if found else []
    if skipped:
        what = ", ".join(f"{count} {kind}" for kind, count in skipped.most_common())
        message = f"skipped {what} records: {command} reads {reads}"
        if not shards and not others:
            raise RecordError(message, ", ".join(where))
        log.info(f"{command}: {message}")
    return shards


def check_sources(command: str, inputs: list[str], kinds: set[str], reads: str) -> None:
    """Inputs that cannot be shards, said in one line before a read would hang or misread:
    stdin on a terminal (UsageError, exit 2) and, for a command that reads env records, Python
    source (RecordError, exit 65; `spade validate` reads .py files itself)."""
    from spade_cli.errors import UsageError

    for item in inputs:
        if item == "-" and stdin_is_terminal():
            raise UsageError(f"{command} reads {reads} on stdin or from files: give a shard or "
                             f"pipe one")
        if "env" in kinds and item.endswith(".py") and os.path.isfile(item):
            raise RecordError(f"{item} is Python source: run `spade validate {item}` first to "
                              f"make an env record ({command} reads {reads})")


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, AttributeError):  # closed or replaced stdin
        return False


def other_kinds(directory: Path, kinds: set[str]) -> Counter:
    """Records per kind in the directory's shard files of kinds outside `kinds`."""
    counts: Counter = Counter()
    for path in sorted(directory.iterdir()):
        kind = path.name.split("-", 1)[0]
        if path.name.endswith(SUFFIXES) and kind in MODELS and kind not in kinds:
            with open_text(str(path)) as fh:
                counts[kind] += sum(1 for line in fh if line.strip())
    return counts
