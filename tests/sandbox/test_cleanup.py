"""Nothing left behind: jails die with the process that started them, and what a killed process
left (scratch dirs, staging dirs, nsjail cgroups) is swept by the next one that starts a jail.

The killed process here is a real one (a python that starts a jail and blocks in a call while
its env spins), killed with SIGKILL, the way an OOM killer or `kill -9` ends `spade rollout`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from sandbox.jail import (CGROUP_ROOT, STALE_AFTER, Limits, Sandbox, Worker, cgroup_controllers,
                          sweep_leftovers)

ROOT = str(Path(__file__).resolve().parents[2])
SPINNER = '''
class SpinEnv:
    def reset(self, seed=None):
        return "ready", {}

    def step(self, action):
        while True:
            pass

    def solution(self):
        return ["x"]
'''
STARTER = f'''
import json, sys
sys.path.insert(0, {ROOT!r})
from sandbox.jail import Limits, Sandbox, Worker
worker = Worker(Sandbox(limits=Limits(call_timeout=300)))
worker.start()
worker.call("load", source={SPINNER!r})
worker.call("reset", seed=0)
print(json.dumps({{"nsjail": worker.proc.pid, "scratch": worker._scratch.name}}), flush=True)
worker.call("step", action="spin")
'''
NEXT_RUN = f'''
import sys
sys.path.insert(0, {ROOT!r})
from sandbox.jail import Worker
with Worker() as worker:
    assert worker.call("ping").ok
'''


def alive(jailkit, proc) -> bool:
    """Whether this very process (same pid, same start time) still runs (zombies do not)."""
    now = jailkit.read_proc(proc.pid)
    return now is not None and now.started == proc.started and now.state != "Z"


def backdate(path: str | Path) -> None:
    old = time.time() - STALE_AFTER - 60
    os.utime(path, (old, old))


@pytest.fixture
def killed_starter(nsjail_ok, jailkit):
    """Start a jail from another python, let its env spin, SIGKILL that python; yields
    (nsjail, jailed worker, scratch dir) as they were before the kill."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        facts = json.loads(starter.stdout.readline())
        nsjail = jailkit.read_proc(facts["nsjail"])
        init = next(p for p in jailkit.processes() if p.ppid == nsjail.pid)
        assert init.uid == jailkit.NOBODY
    finally:
        starter.kill()
        starter.wait()
    yield nsjail, init, facts["scratch"]


def test_jails_die_at_once_with_the_process_that_started_them(killed_starter, jailkit):
    nsjail, init, _ = killed_starter
    deadline = time.monotonic() + 2.0
    while (alive(jailkit, nsjail) or alive(jailkit, init)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(jailkit, nsjail), "nsjail outlived the process that started it"
    assert not alive(jailkit, init), "the jailed worker outlived the process that started it"


def test_the_next_run_sweeps_what_a_killed_run_left(killed_starter, jailkit):
    nsjail, init, scratch = killed_starter
    cgroups = [CGROUP_ROOT / c / "NSJAIL" / f"NSJAIL.{init.pid}"
               for c, usable in cgroup_controllers().items() if usable]
    cgroups = [c for c in cgroups if c.exists()]  # nsjail died by SIGKILL: it could not rmdir
    assert Path(scratch).is_dir()
    deadline = time.monotonic() + 2.0
    while alive(jailkit, init) and time.monotonic() < deadline:
        time.sleep(0.05)
    for path in [scratch, *cgroups]:
        backdate(path)  # what a killed run left is older than STALE_AFTER by the next run
    subprocess.run([sys.executable, "-c", NEXT_RUN], check=True, timeout=60)
    assert not Path(scratch).exists(), "the killed run's scratch dir was not swept"
    assert [c for c in cgroups if c.exists()] == [], "the killed run's cgroups were not swept"


def test_sweeping_spares_live_and_young_dirs(make_worker, tmp_path):
    worker = make_worker()
    live = worker._scratch.name
    backdate(live)
    young = tempfile.mkdtemp(prefix="spade-jail-", dir=tmp_path)
    stale = tempfile.mkdtemp(prefix="spade-jail-", dir=tmp_path)
    staging = tempfile.mkdtemp(prefix=".spade-worker-", dir=tmp_path)
    other = tempfile.mkdtemp(prefix="spade-other-", dir=tmp_path)
    for path in (stale, staging, other):
        backdate(path)
    removed = sweep_leftovers(str(tmp_path)) + sweep_leftovers(os.path.dirname(live))
    assert os.path.isdir(live) and worker.call("ping").ok
    assert os.path.isdir(young) and os.path.isdir(other)
    assert not os.path.exists(stale) and not os.path.exists(staging)
    assert {stale, staging} <= set(removed)


def test_a_jail_started_on_a_short_lived_thread_outlives_it(nsjail_ok):
    """PR_SET_PDEATHSIG fires when the forking *thread* ends: a pool's starter threads must not
    take their jails with them."""
    started: list[Worker] = []

    def start() -> None:
        started.append(Worker(Sandbox(limits=Limits(call_timeout=5))))
        started[0].start()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    time.sleep(0.3)
    try:
        assert started[0].call("ping").ok
    finally:
        started[0].close()


def test_the_leak_detector_ignores_jails_of_other_process_trees(nsjail_ok, jailkit):
    """A jail started by another run (here a python in its own session) is not ours to report."""
    other = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        nsjail_pid = json.loads(other.stdout.readline())["nsjail"]
        assert jailkit.read_proc(nsjail_pid) is not None
        assert [p for p in jailkit.leftovers() if p.pid == nsjail_pid or p.ppid == nsjail_pid] \
            == []
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()
