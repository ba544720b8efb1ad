"""What every benchmark script shares: ratios, plain tables, the PASS/MISS ending, and exit 69
(one line, no traceback) when a jail or a model backend is unavailable here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

EX_UNAVAILABLE = 69


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def table(title: str, headers: list[str], rows: list[list[Any]]) -> str:
    """A plain-text table: first column left-aligned, the rest right-aligned."""
    def fmt(cell: Any) -> str:
        if isinstance(cell, str):
            return cell
        if isinstance(cell, int):
            return str(cell)
        return f"{cell:.3f}" if abs(cell) < 10 else f"{cell:.1f}"

    cells = [headers] + [[fmt(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(row, widths))).rstrip()

    rule = "-" * len(line(headers))
    return "\n".join([title, rule, line(headers), rule, *map(line, cells[1:]), ""])


def finish(results: dict[str, Any], verdicts: list[tuple[str, bool, str]],
           json_path: str | None) -> int:
    """Print a PASS/MISS line per target, optionally write the numbers; a benchmark exits 0."""
    results["targets"] = []
    for name, passed, value in verdicts:
        print(f"{'PASS' if passed else 'MISS'}  {name}: {value}")
        results["targets"].append({"target": name, "pass": passed, "value": value})
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {json_path}")
    return 0


def exit_69_when_unavailable(script: str, body: Callable[[], int]) -> int:
    """`body()`'s exit code; EX_UNAVAILABLE with a one-line message when it finds no usable
    jail or model backend on this machine."""
    from sandbox.jail import SandboxUnavailable
    from stages.backends import BackendUnavailable

    try:
        return body()
    except SandboxUnavailable as exc:
        print(f"{script}: sandbox unavailable: {exc}", file=sys.stderr)
    except BackendUnavailable as exc:
        print(f"{script}: backend unavailable: {exc}", file=sys.stderr)
    return EX_UNAVAILABLE
