"""The one summary line every stage prints on stderr when it ends."""

from __future__ import annotations

import sys
import time

from stages.shards import Stats


def summarize(stage: str, stats: Stats, headline: str) -> None:
    reasons = ", ".join(f"{name} {count}" for name, count in stats.reasons.most_common())
    skipped = f", {stats.skipped_shards} shards already done" if stats.skipped_shards else ""
    seconds = time.monotonic() - stats.started
    print(f"{stage}: {headline}{f' ({reasons})' if reasons else ''}{skipped} in {seconds:.1f}s",
          file=sys.stderr)
