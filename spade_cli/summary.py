"""The one summary line every stage prints on stderr when it ends.

Lines carry env-derived text (skills, reject reasons): they pass through terminal_safe on their
way to the terminal and to the run log.
"""

from __future__ import annotations

import sys
import time

from spade_cli.terminal import terminal_safe
from stages.shards import Stats


_run_log = None


def open_run_log(path) -> None:
    """From now on every summary line is also appended to a run's log file."""
    global _run_log
    _run_log = open(path, "a", encoding="utf-8")


def log_line(line: str, echo: bool = False) -> None:
    line = terminal_safe(line)
    if echo:
        print(line, file=sys.stderr)
    if _run_log is not None:
        _run_log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
        _run_log.flush()


def summarize(stage: str, stats: Stats, headline: str) -> None:
    reasons = ", ".join(f"{name} {count}" for name, count in stats.reasons.most_common())
    skipped = f", {stats.skipped_shards} shards already done" if stats.skipped_shards else ""
    seconds = time.monotonic() - stats.started
    log_line(f"{stage}: {headline}{f' ({reasons})' if reasons else ''}{skipped} in "
             f"{seconds:.1f}s", echo=True)
