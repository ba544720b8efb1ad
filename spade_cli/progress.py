"""Progress of a long command on stderr, with rate and ETA.

In: what a stage reports as it works: units done (plays, envs, designs, steps), units expected,
tokens generated. Out: on a terminal, a rich bar; otherwise a plain line every `interval`
seconds while the stage runs (`rollout: 37/64 plays, 4.1 plays/s, 812 tok/s, eta 7s`), also
while nothing finishes (a heartbeat with the time spent). Nothing under `spade -q`.
Guarantees: never writes to stdout (records go there); the stages stay free of rich (they
report through plain callbacks and iterators, this module renders); one rich display at a
time, shared by `spade run`'s round bar and the bar of the stage it is running.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable, TextIO

INTERVAL = 10.0  # seconds between plain lines
_shared: dict[str, Any] = {"display": None, "users": 0}  # the rich display and its bars


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def status(unit: str, done: int, total: int | None, tokens: int, elapsed: float,
           waiting: bool = True) -> str:
    """`37/64 plays, 4.1 plays/s, 812 tok/s, eta 7s` (parts appear once they mean something);
    `waiting`: before the first unit, say how long it has been."""
    parts = [f"{done}/{total} {unit}" if total is not None else f"{done} {unit}"]
    if done and elapsed > 0:
        rate = done / elapsed
        parts.append(f"{rate:.1f} {unit}/s" if rate >= 1
                     else f"{1 / rate:.1f}s/{unit.removesuffix('s')}")
    if tokens and elapsed > 0:
        parts.append(f"{tokens / elapsed:.0f} tok/s")
    if done and total is not None and total > done:
        parts.append(f"eta {duration((total - done) * elapsed / done)}")
    elif not done and waiting:
        parts.append(f"{duration(elapsed)} elapsed")
    return ", ".join(parts)


class Progress:
    """One command's counters and their display; a context manager."""

    def __init__(self, name: str, unit: str, total: int | None = None, *,
                 periodic: bool = True, interval: float | None = None,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        """`periodic`: plain lines every `interval` seconds (default INTERVAL; 0: at every
        update); without it, plain lines come only from `note`."""
        self.name, self.unit, self.total = name, unit, total
        self.done = self.tokens = 0
        self.periodic, self.clock = periodic, clock
        self.interval = INTERVAL if interval is None else interval
        self.stream = stream
        self.started = self.printed = clock()
        self.shown = logging.getLogger().getEffectiveLevel() <= logging.INFO
        self.rich = self.shown and stream is None and sys.stderr.isatty()
        self.task = None
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None

    # -- what stages report ----------------------------------------------------------------
    def add_total(self, units: int) -> None:
        self.total = (self.total or 0) + units
        self.update()

    def advance(self, units: int = 1) -> None:
        self.done += units
        self.update()

    def add_tokens(self, tokens: int) -> None:
        self.tokens += tokens
        self.update()

    def reached(self, done: int, total: int, tokens: int = 0) -> None:
        """For a stage that counts itself: `done` of `total` units, `tokens` more tokens."""
        self.done, self.total = done, total
        self.tokens += tokens
        self.update()

    def note(self, text: str) -> None:
        """What the command is doing now: the bar's label on a terminal, else a line now."""
        if not self.shown:
            return
        if self.rich:
            self._display().update(self.task, description=text)
        else:
            print(text, file=self.stream or sys.stderr, flush=True)

    def line(self) -> str:
        return f"{self.name}: " + status(self.unit, self.done, self.total, self.tokens,
                                         self.clock() - self.started)

    # -- rendering ---------------------------------------------------------------------------
    def update(self) -> None:
        if not self.shown:
            return
        if self.rich:  # the bar has a ticking elapsed column of its own: no `waiting` part
            self._display().update(self.task, completed=self.done, total=self.total,
                                   status=status(self.unit, self.done, self.total, self.tokens,
                                                 self.clock() - self.started, waiting=False))
        else:
            self._maybe_print()

    def _maybe_print(self) -> None:
        if not self.periodic:
            return
        with self.lock:
            if self.clock() - self.printed < self.interval:
                return
            self.printed = self.clock()
        print(self.line(), file=self.stream or sys.stderr, flush=True)

    def _tick(self) -> None:
        while not self.stop.wait(self.interval):
            self._maybe_print()

    def _display(self):
        return _shared["display"]

    def __enter__(self) -> Progress:
        if not self.shown:
            return self
        if self.rich:
            if _shared["display"] is None:
                _shared["display"] = _start_display()
            _shared["users"] += 1
            self.task = self._display().add_task(self.name, total=self.total, status="")
            self.update()
        elif self.periodic and self.interval > 0:
            self.ticker = threading.Thread(target=self._tick, daemon=True,
                                           name=f"progress-{self.name}")
            self.ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.ticker is not None:
            self.stop.set()
            self.ticker.join()
        if self.task is not None:
            display = self._display()
            display.remove_task(self.task)
            _shared["users"] -= 1
            if not _shared["users"]:
                display.stop()
                _shared["display"] = None


def _start_display():
    """A rich display on stderr; log lines and summaries print above it, stdout is left be."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress as Display, TextColumn, TimeElapsedColumn

    display = Display(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True, redirect_stdout=False)
    display.start()
    return display


class Counted:
    """A backend whose completions' tokens count into a Progress (the stage never knows)."""

    def __init__(self, backend, progress: Progress):
        self._backend, self._progress = backend, progress

    def __getattr__(self, name: str):
        attribute = getattr(self._backend, name)  # `submit` only where the backend streams
        return self._counted_submit(attribute) if name == "submit" else attribute

    def _counted_submit(self, submit):
        def count(done):
            if done.exception() is None:
                self._progress.add_tokens(len(done.result().completion_ids or ()))

        def counted(messages, sampling, tools=None):
            future = submit(messages, sampling, tools)
            future.add_done_callback(count)
            return future
        return counted

    def chat(self, conversations, sampling, tools=None):
        completions = self._backend.chat(conversations, sampling, tools)
        self._progress.add_tokens(sum(len(c.completion_ids or ()) for c in completions))
        return completions
