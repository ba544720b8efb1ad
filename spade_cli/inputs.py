"""Input shards for a stage command, saying what it leaves out.

In: the paths a user gave, the record kinds the command reads and a phrase for them. Out: the
shards to read (stages.shards.find_shards). Guarantees: shard files of other kinds in a named
directory are never ignored in silence: when they are all there is, the command stops with
exit 65 (`rollout-dir: skipped 64 rollout records: validate reads design records and .py files`);
beside shards it reads, one INFO line says what was left out.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

from stages.records import MODELS, RecordError
from stages.shards import SUFFIXES, Shard, find_shards, open_text

log = logging.getLogger("spade.inputs")


def find_inputs(command: str, inputs: list[str], kinds: set[str], reads: str,
                others: bool = False) -> list[Shard]:
    """`reads`: what the command reads, for the message (`design records and .py files`);
    `others`: the command has inputs besides these shards, so finding none is no error."""
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


def other_kinds(directory: Path, kinds: set[str]) -> Counter:
    """Records per kind in the directory's shard files of kinds outside `kinds`."""
    counts: Counter = Counter()
    for path in sorted(directory.iterdir()):
        kind = path.name.split("-", 1)[0]
        if path.name.endswith(SUFFIXES) and kind in MODELS and kind not in kinds:
            with open_text(str(path)) as fh:
                counts[kind] += sum(1 for line in fh if line.strip())
    return counts
