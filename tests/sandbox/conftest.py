"""Fixtures for the sandbox tests: can a jail run here, make workers, and check nothing leaks.

Leak checking is scoped to the jails these tests start: other engineers' test runs on the same
host also start nsjail workers (uid 65534 outside), and other test directories may rely on the
atexit hook to close theirs, so "any uid 65534 process" would be flaky. Every Worker a sandbox
test starts is recorded (its nsjail pid and the pid namespace of its jailed init); at session
teardown none of those nsjail processes may still be our child, and no live (non-zombie) uid
65534 process may sit in one of those namespaces or below one of those nsjails.
Zombies are ignored: a SIGKILLed nsjail leaves its jailed init to be reaped by PID 1, and in some
containers PID 1 never reaps (the process is dead and holds no memory; see test_jail.py's
test_close_reaps_jail_and_cgroups for the jail.py side of that).
"""

from __future__ import annotations

import os
import textwrap
import time
from dataclasses import dataclass

import pytest

from sandbox.jail import Limits, Sandbox, SandboxUnavailable, Worker

NOBODY = 65534


@dataclass
class Proc:
    pid: int
    ppid: int
    uid: int
    state: str
    name: str

    @property
    def pidns(self) -> str | None:
        try:
            return os.readlink(f"/proc/{self.pid}/ns/pid")
        except OSError:
            return None


def processes() -> list[Proc]:
    """Every process on the host, from /proc/*/status."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
            found.append(Proc(int(entry), int(fields["PPid"]), int(fields["Uid"].split()[1]),
                              fields["State"].split()[0], fields["Name"].strip()))
        except (OSError, KeyError, ValueError, IndexError):
            continue  # exited while we looked
    return found


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


_recorded_namespaces: set[str] = set()
_recorded_nsjails: set[int] = set()


def record(worker: Worker) -> None:
    if worker.proc is None or worker.sandbox.mode != "nsjail":
        return
    _recorded_nsjails.add(worker.proc.pid)
    init = jailed_init(worker)
    ns = init.pidns if init else None
    if ns:
        _recorded_namespaces.add(ns)


def leftovers() -> list[Proc]:
    """Live processes that the jails of these tests left behind (see the module docstring)."""
    me = os.getpid()
    procs = processes()
    ours = set()
    for pid in _recorded_nsjails:
        ours |= descendants(pid, procs)
    bad = []
    for proc in procs:
        nsjail_of_ours = proc.ppid == me and proc.pid in _recorded_nsjails
        if proc.state == "Z":
            if nsjail_of_ours:
                bad.append(proc)  # an nsjail nobody waited for
            continue
        if nsjail_of_ours:
            bad.append(proc)
        elif proc.uid == NOBODY and (proc.pid in ours or proc.pidns in _recorded_namespaces):
            bad.append(proc)
    return bad


def wait_for_no_leftovers(timeout: float = 3.0) -> list[Proc]:
    deadline = time.monotonic() + timeout
    while True:
        bad = leftovers()
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _record_workers(monkeypatch):
    """Record every Worker a sandbox test starts (its nsjail pid and its pid namespace)."""
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


@pytest.fixture(scope="session")
def nsjail_ok() -> bool:
    """Skip (with the reason) every test that needs nsjail when it cannot run here."""
    try:
        with Worker(Sandbox(limits=Limits(call_timeout=10))):
            pass
    except SandboxUnavailable as exc:
        pytest.skip(f"nsjail cannot run here: {exc}")
    except OSError as exc:  # e.g. an explicit nsjail path that does not exist
        pytest.skip(f"nsjail cannot run here: {exc!r}")
    return True


@pytest.fixture
def make_worker(request):
    """make_worker(call_timeout=1, mode="nsjail", **limits) -> a started Worker, closed after."""
    made: list[Worker] = []

    def make(call_timeout: float = 1.0, mode: str = "nsjail", **limits) -> Worker:
        if mode == "nsjail":
            request.getfixturevalue("nsjail_ok")
        worker = Worker(Sandbox(mode=mode, limits=Limits(call_timeout=call_timeout, **limits)))
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

    return types.SimpleNamespace(processes=processes, jailed_init=jailed_init,
                                 env_source=env_source, descendants=descendants, NOBODY=NOBODY,
                                 leftovers=leftovers, wait_for_no_leftovers=wait_for_no_leftovers)
