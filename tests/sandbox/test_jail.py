"""Adversarial env programs against the jailed Worker, each containment checked from the host.

Every env here is hostile in `step`, `reset` or at import, and every assertion looks at the host:
a listener that must see no connection, canary files whose secret must never come back, host
paths that must not appear, processes that must stay alive or must be gone, this process's own
memory. Tests that need nsjail skip (with nsjail's reason) where it cannot run; the `--sandbox
none` tests and the `classify_exit` tests run everywhere.

The regression tests at the end pin bugs once found in sandbox/jail.py (leaked cgroups, a
blocking request write, CPU-limit kills read as OOM, launch errors with no message).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandbox.jail import (CGROUP_ROOT, OUTCOMES, Limits, Reply, Sandbox, SandboxUnavailable,
                          Worker, cgroup_controllers, classify_exit, staged_worker_dir)

SLACK = 3.0  # seconds a timed-out call may take beyond call_timeout (kill + reap)


def loaded(worker: Worker, source: str, reset: bool = True) -> Worker:
    reply = worker.call("load", source=source)
    assert reply.ok, reply
    if reset:
        reply = worker.call("reset", seed=0)
        assert reply.ok, reply
    return worker


def timed(worker: Worker, op: str, **fields) -> tuple[Reply, float]:
    start = time.monotonic()
    reply = worker.call(op, **fields)
    return reply, time.monotonic() - start


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def all_text(*replies: Reply) -> str:
    return json.dumps([[r.outcome, r.result, r.error] for r in replies], ensure_ascii=False)


def host_ipv4_addresses() -> list[str]:
    """Non-loopback IPv4 addresses of this host (best effort)."""
    found = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(info[4][0])
    except OSError:
        pass
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing address
        found.add(probe.getsockname()[0])
    except OSError:
        pass
    finally:
        probe.close()
    return sorted(a for a in found if not a.startswith("127."))


# -- network -------------------------------------------------------------------------------------

def test_network_cannot_reach_a_host_listener(make_worker, jailkit):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    accepted: list = []
    stop = threading.Event()

    def accept_loop():
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            accepted.append(addr)
            conn.close()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    targets = ["127.0.0.1", "localhost", *host_ipv4_addresses()]
    try:
        # positive control: the listener does accept connections from the host
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        deadline = time.monotonic() + 2
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert accepted, "control connection from the host was not accepted"
        accepted.clear()

        prelude = f"import socket\nTARGETS = {targets!r}\nPORT = {port}\n"
        source = jailkit.env_source(prelude=prelude, step="""
            seen = {}
            for host in TARGETS:
                try:
                    conn = socket.create_connection((host, PORT), timeout=0.5)
                    seen[host] = "connected"
                    conn.close()
                except Exception as exc:
                    seen[host] = type(exc).__name__ + ": " + str(exc)
            try:
                udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                udp.sendto(b"x", (TARGETS[-1], PORT))
                seen["udp"] = "sent"
            except Exception as exc:
                seen["udp"] = type(exc).__name__
            return repr(seen), 0.0, True, False, {}
        """)
        worker = loaded(make_worker(call_timeout=2 + 0.5 * len(targets)), source)
        reply = worker.call("step", action="go")
        time.sleep(0.3)  # give a connection that did get out time to be accepted
    finally:
        stop.set()
        thread.join(2)
        server.close()
    assert accepted == [], f"the jail reached the host listener: {accepted}"
    assert reply.ok, reply
    seen = ast.literal_eval(reply.result[0])
    for host in targets:
        assert seen[host] != "connected", seen
        assert "Error" in seen[host] or "error" in seen[host], seen  # the env saw a failure


# -- host files ----------------------------------------------------------------------------------

def test_host_files_and_environment_are_invisible(make_worker, jailkit, tmp_path, monkeypatch):
    secret = secrets.token_hex(16)
    local_canary = tmp_path / "canary.txt"
    local_canary.write_text(secret)
    # a world-readable canary: only the mount namespace keeps uid nobody from reading it
    shared_dir = Path(f"/var/tmp/spade-canary-{secrets.token_hex(6)}")
    shared_dir.mkdir(mode=0o755)
    try:
        shared_canary = shared_dir / "secret.txt"
        shared_canary.write_text(secret)
        os.chmod(shared_dir, 0o755)
        os.chmod(shared_canary, 0o644)
        monkeypatch.setenv("SPADE_TEST_CANARY", secret)  # the host environment must not leak
        paths = [str(local_canary), str(shared_canary), "/etc/hostname", "/etc/passwd",
                 "/etc/shadow", "/root/.bashrc", "/proc/1/environ", "/proc/self/environ",
                 str(Path(__file__).resolve())]
        listings = ["/", "/tmp", "/root", "/home", "/etc", "/proc", "/var/tmp", str(tmp_path),
                    str(shared_dir)]
        source = jailkit.env_source(
            prelude=f"import json, os\nPATHS = {paths!r}\nLISTINGS = {listings!r}\n",
            reset="self.seen = sorted(os.listdir('/'))",
            step="""
            found = {"root": self.seen}
            for path in PATHS:
                try:
                    with open(path, errors="replace") as fh:
                        found[path] = fh.read(4096)
                except Exception as exc:
                    found[path] = "ERR " + type(exc).__name__
            for path in LISTINGS:
                try:
                    found["ls " + path] = sorted(os.listdir(path))
                except Exception as exc:
                    found["ls " + path] = "ERR " + type(exc).__name__
            found["environ"] = dict(os.environ)
            found["nodename"] = os.uname().nodename
            return json.dumps(found), 0.0, True, False, found
            """)
        worker = make_worker(call_timeout=2)
        replies = [worker.call("load", source=source), worker.call("reset", seed=0),
                   worker.call("step", action="look")]
    finally:
        shutil.rmtree(shared_dir, ignore_errors=True)
    assert all(r.ok for r in replies), replies
    text = all_text(*replies)
    assert secret not in text, "a host secret reached the env"
    found = json.loads(replies[2].result[0])
    for path in paths:
        assert found[path].startswith("ERR "), (path, found[path][:200])
    hidden = {"root", "home", "etc", "proc", "var", "work", "sys", "boot"}
    assert not hidden & set(found["root"]), found["root"]
    assert isinstance(found["ls /proc"], str) and isinstance(found["ls /root"], str)
    assert "SPADE_TEST_CANARY" not in found["environ"]
    try:
        hostname = Path("/etc/hostname").read_text().strip()
    except OSError:
        hostname = ""
    if len(hostname) >= 6 and hostname != found["nodename"]:
        assert hostname not in text, "the host name reached the env"


# -- writes --------------------------------------------------------------------------------------

def test_writes_outside_the_jail_tmpfs_fail(make_worker, jailkit, tmp_path):
    token = secrets.token_hex(8)
    host_targets = [f"/usr/spade-canary-{token}", f"/etc/spade-canary-{token}",
                    f"/lib/spade-canary-{token}", f"/spade-canary-{token}",
                    f"/var/tmp/spade-canary-{token}", str(tmp_path / f"written-{token}")]
    jail_targets = ["/spade/x", "/spade/worker.py", f"/dev/spade-canary-{token}"]
    inside = f"/tmp/spade-canary-{token}"
    staged = Path(staged_worker_dir()) / "worker.py"
    before = hashlib.sha256(staged.read_bytes()).hexdigest()
    source = jailkit.env_source(
        prelude=f"import os\nTARGETS = {host_targets + jail_targets!r}\nINSIDE = {inside!r}\n"
                f"TOKEN = {token!r}\n",
        step="""
        result = {}
        for path in TARGETS + [INSIDE]:
            try:
                if path.startswith("/tmp/"):
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as fh:
                    fh.write(TOKEN)
                result[path] = "written"
            except Exception as exc:
                result[path] = type(exc).__name__
        with open(INSIDE) as fh:
            result["read back"] = fh.read()
        return repr(result), 0.0, True, False, {}
        """)
    try:
        reply = loaded(make_worker(call_timeout=2), source).call("step", action="write")
        assert reply.ok, reply
        result = ast.literal_eval(reply.result[0])
        for path in host_targets:
            assert not os.path.exists(path), f"the jail wrote {path} on the host"
            if not path.startswith("/tmp/"):  # tmp_path lives under /tmp: the jail's own tmpfs
                assert result[path] != "written", (path, result)
        for path in jail_targets:
            assert result[path] != "written", (path, result)
        assert result[inside] == "written" and result["read back"] == token, result
        assert not os.path.exists(inside), "the jail's /tmp is the host's /tmp"
        assert hashlib.sha256(staged.read_bytes()).hexdigest() == before
    finally:
        for path in host_targets + [inside]:
            if os.path.isfile(path):
                os.unlink(path)


# -- processes -----------------------------------------------------------------------------------

def namespace_members(jailkit, pidns: str) -> list:
    return [p for p in jailkit.processes() if p.state != "Z" and p.pidns == pidns]


def wait_until_empty(jailkit, pidns: str, timeout: float = 3.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        members = namespace_members(jailkit, pidns)
        if not members or time.monotonic() > deadline:
            return members
        time.sleep(0.05)


def test_fork_bomb_is_capped_and_cleaned_up(make_worker, jailkit):
    pids_limit = 16
    worker = make_worker(call_timeout=3, pids=pids_limit)
    init = jailkit.jailed_init(worker)
    assert init is not None and init.uid == jailkit.NOBODY
    pidns = init.pidns
    source = jailkit.env_source(prelude="import os, time\n", step="""
        count, error = 0, ""
        while count < 1000:
            try:
                pid = os.fork()
            except OSError as exc:
                error = type(exc).__name__
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            count += 1
        return f"{count} {error}", 0.0, True, False, {}
        """)
    reply = loaded(worker, source).call("step", action="fork")
    assert reply.ok, reply
    count, error = reply.result[0].split()
    assert int(count) < pids_limit and error, reply.result
    members = namespace_members(jailkit, pidns)
    assert 1 < len(members) <= pids_limit, members
    assert all(p.uid == jailkit.NOBODY for p in members), members
    assert worker.call("reset", seed=1).ok  # the worker itself is still serving
    worker.close()
    assert wait_until_empty(jailkit, pidns) == [], "forked processes outlived their jail"


def test_endless_fork_bomb_ends_the_call(make_worker, jailkit):
    worker = make_worker(call_timeout=1)
    pidns = jailkit.jailed_init(worker).pidns
    source = jailkit.env_source(prelude="import os\n", step="""
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """)
    reply, elapsed = timed(loaded(worker, source), "step", action="boom")
    assert reply.outcome in ("ok", "program_error", "timeout"), reply
    assert elapsed < 1 + SLACK
    worker.close()
    assert wait_until_empty(jailkit, pidns) == [], "fork bomb survived its jail"
    fresh = make_worker(call_timeout=2)
    assert fresh.call("ping").ok


def test_signals_cannot_leave_the_jail(make_worker, jailkit):
    as_nobody = {"user": jailkit.NOBODY, "group": jailkit.NOBODY} if os.geteuid() == 0 else {}
    sleeper = subprocess.Popen(["sleep", "60"], **as_nobody)  # same uid as the jail, if we can
    try:
        worker = make_worker(call_timeout=2)
        targets = [os.getpid(), sleeper.pid, worker.proc.pid, os.getppid(), 1]
        source = jailkit.env_source(prelude=f"import os, signal\nTARGETS = {targets!r}\n", step="""
            results = {}
            attempts = [("getppid", lambda: os.kill(os.getppid(), signal.SIGKILL)),
                        ("everyone", lambda: os.kill(-1, signal.SIGKILL)),
                        ("own group", lambda: os.killpg(0, signal.SIGKILL))]
            attempts += [(f"pid {pid}", lambda pid=pid: os.kill(pid, signal.SIGKILL))
                         for pid in TARGETS]
            attempts += [(f"group {pid}", lambda pid=pid: os.killpg(pid, signal.SIGKILL))
                         for pid in TARGETS]
            for name, attempt in attempts:
                try:
                    attempt()
                    results[name] = "sent"
                except Exception as exc:
                    results[name] = type(exc).__name__
            return repr(results), 0.0, True, False, {}
            """)
        reply = loaded(worker, source).call("step", action="kill")
        time.sleep(0.2)
        assert sleeper.poll() is None, "a host process (same uid) was killed from inside the jail"
        assert worker.proc.poll() is None, "nsjail itself was killed from inside the jail"
        assert reply.outcome in ("ok", "program_error"), reply
        assert worker.call("reset", seed=0).ok  # the worker (pid 1 of its namespace) lives on
    finally:
        sleeper.kill()
        sleeper.wait()


# -- resources -----------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [
    "hold = bytearray(4 << 30)",
    "hold = []\nwhile True:\n    hold.append(bytearray(b'\\x01') * (1 << 20))",
], ids=["4GiB-at-once", "1MiB-at-a-time"])
def test_memory_bomb_is_oom(make_worker, jailkit, step):
    worker = loaded(make_worker(call_timeout=10, memory_mb=128), jailkit.env_source(step=step))
    before = rss_mb()
    reply, elapsed = timed(worker, "step", action="eat")
    assert reply.outcome == "oom", reply
    assert elapsed < 10
    assert rss_mb() - before < 64


@pytest.mark.parametrize("where", ["import", "reset", "step", "sleep-in-step",
                                   "loop-that-swallows-exceptions"])
def test_infinite_loop_times_out(make_worker, jailkit, where):
    call_timeout = 1.0
    loop = "while True: pass"
    if where == "import":
        source = jailkit.env_source(prelude=loop + "\n")
    elif where == "reset":
        source = jailkit.env_source(reset=loop)
    elif where == "sleep-in-step":
        source = jailkit.env_source(prelude="import time\n", step="time.sleep(3600)")
    elif where == "loop-that-swallows-exceptions":
        source = jailkit.env_source(step="""
            while True:
                try:
                    while True:
                        pass
                except BaseException:
                    pass
            """)
    else:
        source = jailkit.env_source(step=loop)
    worker = make_worker(call_timeout=call_timeout)
    op = "load" if where == "import" else "reset" if where == "reset" else "step"
    if op != "load":
        assert worker.call("load", source=source).ok
    if op == "step":
        assert worker.call("reset", seed=0).ok
    reply, elapsed = timed(worker, op, source=source) if op == "load" else \
        timed(worker, op, seed=0) if op == "reset" else timed(worker, op, action="wait")
    assert reply.outcome == "timeout", reply
    assert elapsed < call_timeout + SLACK, elapsed
    assert worker.call("ping").outcome == "timeout"  # the worker is gone; its fate is sticky


@pytest.mark.parametrize("step", [
    "while True:\n    print('x' * 1000)",
    "while True:\n    os.write(2, b'y' * 65536)",
    "while True:\n    try:\n        print('z' * 1000)\n    except BaseException:\n        pass",
    # garbage without a newline straight onto every descriptor, the protocol pipe included
    "while True:\n    for fd in range(1, 10):\n        try:\n"
    "            os.write(fd, b'w' * 65536)\n        except OSError:\n            pass",
], ids=["print", "stderr", "print-swallowing-errors", "protocol-fd"])
def test_output_flood_is_cut_off(make_worker, jailkit, step):
    worker = loaded(make_worker(call_timeout=2), jailkit.env_source(prelude="import os\n",
                                                                     step=step))
    before = rss_mb()
    reply, elapsed = timed(worker, "step", action="shout")
    assert reply.outcome in ("output_limit", "timeout"), reply
    assert elapsed < 2 + SLACK
    assert rss_mb() - before < 64, "the flood grew the host process"
    scratch = getattr(worker, "_scratch", None)
    if scratch is not None:  # the env's stdout/stderr land in a host file capped by fsize
        stderr_file = Path(scratch.name) / "stderr"
        if stderr_file.exists():
            assert stderr_file.stat().st_size <= worker.limits.fsize_mb * 1024 * 1024


@pytest.mark.parametrize("op", ["reset", "step"])
def test_huge_observation_is_output_limit(make_worker, jailkit, op):
    huge = "'x' * (10 << 20)"
    source = jailkit.env_source(reset=f"return {huge}, {{}}" if op == "reset" else "pass",
                                step=f"return {huge}, 0.0, False, False, {{}}")
    worker = make_worker(call_timeout=5)
    assert worker.call("load", source=source).ok
    if op == "step":
        assert worker.call("reset", seed=0).ok
    before = rss_mb()
    reply = worker.call(op, seed=0) if op == "reset" else worker.call(op, action="big")
    assert reply.outcome == "output_limit", reply
    assert rss_mb() - before < 64


# -- exits ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("step,error_type,detail,survives", [
    ("import sys\nsys.exit(3)", "SystemExit", "3", True),
    ("raise KeyboardInterrupt", "KeyboardInterrupt", "", True),
    ("import os\nos._exit(3)", "exited", "status: 3", False),
    ("import ctypes\nctypes.string_at(0)", "exited", "SIGSEGV", False),
    ("import os\nos.abort()", "exited", "signal", False),  # pid 1 ignores SIGABRT: SIGSEGV
], ids=["sys.exit", "KeyboardInterrupt", "os._exit", "segfault", "abort"])
def test_exits_are_program_errors(make_worker, jailkit, step, error_type, detail, survives):
    worker = loaded(make_worker(call_timeout=2), jailkit.env_source(step=step))
    reply = worker.call("step", action="die")
    assert reply.outcome == "program_error", reply
    assert reply.error["type"] == error_type, reply
    assert detail in reply.error["msg"], reply
    after = worker.call("reset", seed=0)
    assert after.ok is survives, after


# -- the protocol --------------------------------------------------------------------------------

def test_stdin_and_stdout_do_not_corrupt_the_protocol(make_worker, jailkit):
    forged = b'{"ok": true, "result": ["forged", 1.0, true, false, {}], "shape": ["tuple", 5]}\n'
    source = jailkit.env_source(prelude=f"import os, sys\nFORGED = {forged!r}\n", step="""
        data = sys.stdin.read()
        raw = os.read(0, 100)
        os.write(1, FORGED)
        print(FORGED.decode(), end="")
        sys.stdout.flush()
        sys.__stdout__.write(FORGED.decode())
        try:
            answer = input()
        except EOFError:
            answer = "EOF"
        self.calls = getattr(self, "calls", 0) + 1
        return f"real {self.calls} {data!r} {raw!r} {answer}", 0.0, False, False, {}
        """)
    worker = loaded(make_worker(call_timeout=2), source)
    first = worker.call("step", action="read")
    second = worker.call("step", action="read")
    assert first.ok and first.result[0] == "real 1 '' b'' EOF", first
    assert second.ok and second.result[0] == "real 2 '' b'' EOF", second
    assert worker.call("reset", seed=0).ok


# -- lifetime and start-up -----------------------------------------------------------------------

def test_lifetime_limit_is_timeout(make_worker, jailkit):
    source = jailkit.env_source(prelude="import time\n", reset="time.sleep(30)")
    # nsjail counts its time limit in whole seconds: with 1 s a jail can be killed before
    # `load` answers, so the limit is 2 s
    worker = make_worker(call_timeout=6, lifetime=2)
    assert worker.call("load", source=source).ok
    reply, elapsed = timed(worker, "reset", seed=0)
    assert reply.outcome == "timeout" and "time limit" in reply.error["msg"], reply
    assert elapsed < 2 + SLACK


def test_unreadable_python_is_sandbox_unavailable(nsjail_ok):
    with pytest.raises(SandboxUnavailable):
        Worker(Sandbox(python="/nonexistent/python3", limits=Limits(call_timeout=5))).start()


# -- --sandbox none: a plain subprocess with rlimits, the same outcomes --------------------------

@pytest.mark.parametrize("step,outcome,call_timeout", [
    ("while True: pass", "timeout", 1.0),
    ("hold = bytearray(4 << 30)", "oom", 5.0),
    ("hold = []\nwhile True:\n    hold.append(bytearray(b'\\x01') * (1 << 20))", "oom", 5.0),
    ("import os\nos._exit(3)", "program_error", 5.0),
    ("raise ValueError('nope')", "program_error", 5.0),
], ids=["timeout", "oom-at-once", "oom-gradual", "os._exit", "raise"])
def test_none_mode_outcomes(make_worker, jailkit, step, outcome, call_timeout):
    worker = loaded(make_worker(call_timeout=call_timeout, mode="none", memory_mb=128),
                    jailkit.env_source(step=step))
    reply, elapsed = timed(worker, "step", action="x")
    assert reply.outcome == outcome, reply
    assert elapsed < call_timeout + SLACK


# -- classify_exit: nsjail's log lines to outcomes (pure) ----------------------------------------

KILLED = "pid=6440 ([STANDALONE MODE]) terminated with signal: SIGKILL (9), (PIDs left: 0)"


@pytest.mark.parametrize("code,log,mode,memory_cgroup,outcome", [
    (137, KILLED, "nsjail", True, "oom"),
    (137, KILLED, "nsjail", False, "program_error"),
    (137, "pid=13550 run time >= time limit (1 >= 1) ([STANDALONE MODE]). Killing it | " + KILLED,
     "nsjail", True, "timeout"),
    (152, "pid=7 ([STANDALONE MODE]) terminated with signal: SIGXCPU (24), (PIDs left: 0)",
     "nsjail", True, "timeout"),
    (255, "runChild():526 Received error message from the child process before it has been "
          "executed | standaloneMode():274 Couldn't launch the child process", "nsjail", True,
     "sandbox_failure"),
    (255, "Launching child process failed", "nsjail", False, "sandbox_failure"),
    (255, "", "nsjail", False, "sandbox_failure"),
    (255, "pid=9 ([STANDALONE MODE]) exited with status: 255, (PIDs left: 0)", "nsjail", True,
     "program_error"),
    (3, "pid=6534 ([STANDALONE MODE]) exited with status: 3, (PIDs left: 0)", "nsjail", True,
     "program_error"),
    (139, "pid=6536 ([STANDALONE MODE]) terminated with signal: SIGSEGV (11), (PIDs left: 0)",
     "nsjail", True, "program_error"),
    (None, "", "nsjail", True, "program_error"),
    (-signal.SIGXCPU, "", "none", False, "timeout"),
    (-signal.SIGKILL, "", "none", False, "oom"),
    (3, "", "none", False, "program_error"),
    (-signal.SIGSEGV, "", "none", False, "program_error"),
    (None, "", "none", False, "program_error"),
])
def test_classify_exit(code, log, mode, memory_cgroup, outcome):
    reply = classify_exit(code, log, mode, memory_cgroup)
    assert reply.outcome == outcome
    assert reply.outcome in OUTCOMES and not reply.ok
    assert reply.error and "msg" in reply.error
    if mode == "nsjail" and log:
        assert reply.error["msg"] == log  # the log is the message: it says what happened


# -- the leak detector the session fixture relies on ---------------------------------------------

def test_leak_detector_sees_an_unclosed_jail(nsjail_ok, jailkit):
    worker = Worker(Sandbox(limits=Limits(call_timeout=2)))
    worker.start()
    try:
        bad = jailkit.leftovers()
        assert any(p.pid == worker.proc.pid for p in bad), bad  # the nsjail child of this process
        assert any(p.uid == jailkit.NOBODY for p in bad), bad  # and the jailed worker
    finally:
        worker.close()
    assert jailkit.wait_for_no_leftovers() == []


# -- regressions: bugs once found in sandbox/jail.py ------------------------------------------

def _cgroup_dirs(init_pid: int) -> list[Path]:
    usable = cgroup_controllers()
    return [CGROUP_ROOT / c / "NSJAIL" / f"NSJAIL.{init_pid}" for c in ("memory", "pids")
            if usable.get(c)]


@pytest.mark.parametrize("how", ["close", "timeout"])
def test_close_reaps_jail_and_cgroups(make_worker, jailkit, how):
    worker = make_worker(call_timeout=1)
    init = jailkit.jailed_init(worker)
    dirs = _cgroup_dirs(init.pid)
    if not dirs:
        pytest.skip("no cgroup v1 controllers in use here")
    assert all(d.exists() for d in dirs)
    loaded(worker, jailkit.env_source(step="while True: pass"))
    if how == "timeout":
        assert worker.call("step", action="x").outcome == "timeout"
    worker.close()
    time.sleep(0.2)
    assert [d for d in dirs if d.exists()] == [], "nsjail's cgroups were left behind"


def test_big_request_to_a_stuck_worker_respects_call_timeout(make_worker, jailkit):
    source = jailkit.env_source(prelude="import sys, threading, time\n", reset=(
        "sys.setswitchinterval(1000); threading.Thread(target=lambda: (time.sleep(0.3), "
        "any(iter(int, 1))), daemon=True).start()"))
    worker = loaded(make_worker(call_timeout=1), source)
    time.sleep(0.6)  # the hog thread now spins in C holding the GIL: the worker reads no more
    result: dict = {}

    def call():
        result["reply"], result["elapsed"] = timed(worker, "step", action="a" * (1 << 20))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(1 + SLACK)
    stuck = thread.is_alive()
    if stuck:  # unblock the write so the test (and the session) can go on
        os.kill(worker.proc.pid, signal.SIGTERM)
        thread.join(5)
    assert not stuck, "Worker.call blocked past call_timeout writing the request"
    assert result["reply"].outcome == "timeout"


def test_cpu_rlimit_is_timeout(make_worker, jailkit):
    worker = loaded(make_worker(call_timeout=6, cpu_seconds=1),
                    jailkit.env_source(step="while True: pass"))
    reply = worker.call("step", action="spin")
    assert reply.outcome == "timeout", reply


def test_missing_nsjail_binary_is_sandbox_unavailable(tmp_path):
    with pytest.raises(SandboxUnavailable):
        Worker(Sandbox(nsjail=str(tmp_path / "no-nsjail"))).start()


def test_sandbox_failure_without_a_log_still_says_something():
    reply = classify_exit(255, "", "nsjail", False)
    assert reply.outcome == "sandbox_failure" and reply.error["msg"]
