"""Fixtures for the sandbox tests: can a jail run here, make workers, and check nothing leaks.

Leak checking is scoped to the jails these tests start, never "every uid 65534 process": a
`spade run` or a second test run on the same host has jails of its own. Every Worker a sandbox
test starts is recorded: its nsjail and the jailed worker (pid 1 of the jail's pid namespace),
each as (pid, start time), so a pid the kernel hands to someone else's process later is not
mistaken for ours. At session teardown none of them, and nothing below them, may be alive.
Zombies are ignored (dead, holding no memory; in some containers PID 1 never reaps them), except
an nsjail of ours that nobody waited for.
"""

from __future__ import annotations

import os
import textwrap
import time
from dataclasses import dataclass

import pytest

from sandbox.jail import Limits, Sandbox, Worker

NOBODY = 65534


@dataclass
class Proc:
    pid: int
    ppid: int
    uid: int
    state: str
    name: str
    started: int  # clock ticks after boot: with the pid, it names one process for good

    @property
    def pidns(self) -> str | None:
        try:
            return os.readlink(f"/proc/{self.pid}/ns/pid")
        except OSError:
            return None


def read_proc(pid: int) -> Proc | None:
    """One process from /proc/PID/status and /proc/PID/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
        return Proc(pid, int(fields["PPid"]), int(fields["Uid"].split()[1]),
                    fields["State"].split()[0], fields["Name"].strip(), int(stat[19]))
    except (OSError, KeyError, ValueError, IndexError):
        return None  # exited while we looked


def processes() -> list[Proc]:
    """Every process on the host."""
    found = (read_proc(int(entry)) for entry in os.listdir("/proc") if entry.isdigit())
    return [proc for proc in found if proc is not None]


def descendants(root: int, procs: list[Proc]) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc.pid)
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def jailed_init(worker: Worker) -> Proc | None:
    """The jailed process (the worker's python, pid 1 of its namespace) under a Worker's nsjail."""
    if worker.proc is None or worker.sandbox.mode != "nsjail":
        return None
    for proc in processes():
        if proc.ppid == worker.proc.pid:
            return proc
    return None


_recorded: set[tuple[int, int]] = set()  # (pid, start time) of our nsjails and jailed workers


def record(worker: Worker) -> None:
    if worker.proc is None or worker.sandbox.mode != "nsjail":
        return
    for proc in (read_proc(worker.proc.pid), jailed_init(worker)):
        if proc is not None:
            _recorded.add((proc.pid, proc.started))


def leftovers() -> list[Proc]:
    """Live processes that the jails of these tests left behind (see the module docstring)."""
    me = os.getpid()
    procs = processes()
    ours = {proc.pid for proc in procs if (proc.pid, proc.started) in _recorded}
    for pid in list(ours):
        ours |= descendants(pid, procs)
    return [proc for proc in procs if proc.pid in ours
            and (proc.state != "Z" or proc.ppid == me)]  # a zombie child of ours: never waited


def wait_for_no_leftovers(timeout: float = 3.0) -> list[Proc]:
    deadline = time.monotonic() + timeout
    while True:
        bad = leftovers()
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _record_workers(monkeypatch):
    """Record every Worker a sandbox test starts (its nsjail and its jailed worker)."""
    original = Worker.start

    def recording_start(self, *args, **kwargs):
        reply = original(self, *args, **kwargs)
        record(self)
        return reply

    monkeypatch.setattr(Worker, "start", recording_start)


@pytest.fixture(scope="session", autouse=True)
def no_leftover_jails():
    """At the end of the session, no jail started by a sandbox test may have left anything."""
    yield
    bad = wait_for_no_leftovers()
    assert not bad, f"processes left behind by the sandbox tests' jails: {bad}"


@pytest.fixture
def make_worker(request):
    """make_worker(call_timeout=1, mode="nsjail", name_refusals=False, **limits) -> a started
    Worker, closed after. The worker's audit hook is off unless asked for: these tests are of the
    jail's own boundary, which must hold without it."""
    made: list[Worker] = []

    def make(call_timeout: float = 1.0, mode: str = "nsjail", name_refusals: bool = False,
             **limits) -> Worker:
        if mode == "nsjail":
            request.getfixturevalue("nsjail_ok")
        worker = Worker(Sandbox(mode=mode, limits=Limits(call_timeout=call_timeout, **limits),
                                name_refusals=name_refusals))
        worker.start()
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.close()


HEADER = '''
class HostileEnv:
    max_turns = 5

    def reset(self, seed=None):
        {reset}
        return "ready", {{}}

    def solution(self):
        return ["x"]

    def step(self, action):
{step}
'''


def env_source(step: str = "return 'ok', 0.0, True, False, {}", reset: str = "pass",
               prelude: str = "") -> str:
    """A minimal env whose `step` body (and one-line `reset` prefix, module prelude) we choose."""
    body = textwrap.indent(textwrap.dedent(step).strip("\n"), " " * 8)
    return textwrap.dedent(prelude) + HEADER.format(reset=reset, step=body)


@pytest.fixture
def jailkit():
    """The helpers above, for test modules (tests/ has no packages, so they can't import them)."""
    import types

    return types.SimpleNamespace(processes=processes, read_proc=read_proc,
                                 jailed_init=jailed_init, env_source=env_source,
                                 descendants=descendants, NOBODY=NOBODY, leftovers=leftovers,
                                 wait_for_no_leftovers=wait_for_no_leftovers)
