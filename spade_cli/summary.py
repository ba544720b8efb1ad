"""The one summary line every stage prints on stderr when it ends.

Before it, one warning line per input record the stage met more than once and used once.

Lines carry env-derived text (skills, reject reasons): they pass through terminal_safe on their
way to the terminal and to the run log.
"""

from __future__ import annotations

import sys
import time

from spade_cli.terminal import terminal_safe
from stages.shards import Stats
from stages.trust import open_append


_run_log = None


def open_run_log(path) -> None:
    """From now on every summary line is also appended to a run's log file (never through a
    symlink: stages/trust.py)."""
    global _run_log
    _run_log = open_append(path, "a", encoding="utf-8")


def log_line(line: str, echo: bool = False) -> None:
    line = terminal_safe(line)
    if echo:
        print(line, file=sys.stderr)
    if _run_log is not None:
        _run_log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
        _run_log.flush()


WARNED_REPEATS = 5  # repeated inputs named one a line; the rest in one count


def warn_repeats(stage: str, stats: Stats) -> None:
    """One warning line per input record met more than once (the stage used it once)."""
    repeated = stats.repeated()
    for kind, id_, times in repeated[:WARNED_REPEATS]:
        log_line(f"spade {stage}: warning: {kind} {id_} appears {times} times in the inputs; "
                 f"using it once", echo=True)
    if len(repeated) > WARNED_REPEATS:
        log_line(f"spade {stage}: warning: {len(repeated) - WARNED_REPEATS} more records appear "
                 f"more than once in the inputs; using each once", echo=True)


def summarize(stage: str, stats: Stats, headline: str) -> None:
    warn_repeats(stage, stats)
    reasons = ", ".join(f"{name} {count}" for name, count in stats.reasons.most_common())
    skipped = f", {stats.skipped_shards} shards already done" if stats.skipped_shards else ""
    seconds = time.monotonic() - stats.started
    log_line(f"{stage}: {headline}{f' ({reasons})' if reasons else ''}{skipped} in "
             f"{seconds:.1f}s", echo=True)
