"""A pool of started jail workers, so a play rarely waits for a jail to start.

In: a Sandbox, how many workers to keep ready, and where jails run: a WorkerSource, whose
`worker(sandbox)` makes each one (default LocalJails, this process's jails; stages/executor.py's
executors are sources too, so a pool on a Ray cluster hands out RemoteWorkers whose jails live
on the cluster's nodes).
Out: `take()` hands out a started worker.
Guarantees: workers are env-agnostic until `load`, so which play gets which worker changes no
result (runs stay reproducible); starting happens on background threads, overlapping with
model loading and generation; `close()` stops every worker it still holds; a jail that cannot
start surfaces as SandboxUnavailable from `take()`. `fit_concurrency` is the one check of
how many jails at once the host's memory holds (each jail's memory limit is its own), used by
`spade rollout` and `spade validate` at start. Each worker serves exactly one play: a pool
never hands a used worker out again, and `retire()` stops used ones off the critical path.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from sandbox.jail import Reply, Sandbox, Worker

STARTS_PER_NODE = 2  # jails one node starts at once: a start is mostly that node's CPU time


class JailWorker(Protocol):
    """What a pool hands out: sandbox.jail.Worker, or a stand-in with its calls and replies."""

    sandbox: Sandbox

    def start(self) -> Reply: ...
    def call(self, op: str, **fields: Any) -> Reply: ...
    def close(self) -> None: ...


class WorkerSource(Protocol):
    """Where a pool's jails run: `starts` jail starts at once, each worker made by `worker`."""

    starts: int

    def worker(self, sandbox: Sandbox) -> JailWorker: ...


class LocalJails:
    """Jails started by this process."""

    starts = STARTS_PER_NODE

    def worker(self, sandbox: Sandbox) -> Worker:
        return Worker(sandbox)


def available_mb(meminfo: str = "/proc/meminfo") -> int | None:
    """The host's MemAvailable in MiB, or None where it cannot be read (not Linux)."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fit_concurrency(concurrency: int, memory_mb: int, jails_each: int = 1,
                    available: int | None = None, what: str = "--concurrency") -> tuple[int, str | None]:
    """How many of `concurrency` (each holding `jails_each` jails of `memory_mb`: jail memory is
    a per-jail limit) fit in the host's available memory (MemAvailable, or `available` MiB);
    returns (the count, one warning line or None). Never below 1; unknown memory changes
    nothing."""
    if available is None:
        available = available_mb()
    need = concurrency * jails_each * memory_mb
    if available is None or need <= available:
        return concurrency, None
    fits = max(1, available // (jails_each * memory_mb))
    each = f"{jails_each} x {memory_mb}" if jails_each > 1 else f"{memory_mb}"
    return fits, (f"{what} {concurrency} x {each} MiB of jail memory = {need} MiB, more than "
                  f"the {available} MiB this host has available: running {fits} at once")


class WorkerPool:
    def __init__(self, sandbox: Sandbox, ready: int, plays: int | None = None,
                 executor: WorkerSource | None = None):
        """Keep `ready` workers started; start no more than `plays` in all, when known."""
        executor = executor or LocalJails()
        self.sandbox = sandbox
        self.executor = executor
        self.budget = plays
        self.ready: queue.SimpleQueue[Future] = queue.SimpleQueue()
        self.starter = ThreadPoolExecutor(max_workers=executor.starts,
                                          thread_name_prefix="jail-start")
        self.pending: list[Future] = []
        self.retired: list[Future] = []
        for _ in range(ready):
            self._start_one()

    def _start_one(self) -> None:
        if self.budget is not None:
            if self.budget <= 0:
                return
            self.budget -= 1
        future = self.starter.submit(self._started)
        self.pending.append(future)
        self.ready.put(future)

    def _started(self) -> JailWorker:
        worker = self.executor.worker(self.sandbox)
        worker.start()
        return worker

    def take(self) -> JailWorker:
        """A started worker; a replacement starts in the background while plays remain."""
        try:
            future = self.ready.get_nowait()
        except queue.Empty:  # more plays than announced: start one here
            return self._started()
        self.pending.remove(future)
        self._start_one()
        return future.result()

    def retire(self, worker: JailWorker) -> None:
        """Stop a used worker on a background thread: a finished play does not wait for it."""
        self.retired.append(self.starter.submit(worker.close))

    def close(self) -> None:
        self.starter.shutdown(wait=True)
        for future in self.pending:
            if future.exception() is None:
                future.result().close()
        self.pending.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
