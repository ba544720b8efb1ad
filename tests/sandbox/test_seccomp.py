"""The jail's seccomp policy: what a stdlib env never needs is refused, what it uses still works.

An env reaches raw syscalls through `__import__("ctypes")` (the AST check cannot stop that: the
jail is the boundary), so every probe here calls `syscall(2)` by its x86-64 number from inside
the jail. A control run under an allow-all policy shows the refusals come from the policy, not
from missing capabilities.
"""

from __future__ import annotations

import errno
import platform

import pytest

from sandbox import jail

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="syscall numbers below are x86-64's")

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x40000000, 0x20000, 17

# name: (x86-64 syscall number, arguments); pointers are NULL or short byte strings
REFUSED = {
    "unshare": (272, [CLONE_NEWUSER | CLONE_NEWNET]),
    "setns": (308, [0, 0]),
    "clone(CLONE_NEWUSER)": (56, [CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0]),
    "clone(CLONE_NEWNS)": (56, [CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0]),
    "mount": (165, [b"none", b"/tmp", b"tmpfs", 0, 0]),
    "umount2": (166, [b"/tmp", 0]),
    "pivot_root": (155, [b"/tmp", b"/tmp"]),
    "chroot": (161, [b"/tmp"]),
    "open_tree": (428, [-100, b"/tmp", 0]),
    "move_mount": (429, [-100, b"/tmp", -100, b"/usr", 0]),
    "fsopen": (430, [b"tmpfs", 0]),
    "fsconfig": (431, [0, 0, 0, 0, 0]),
    "fsmount": (432, [0, 0, 0]),
    "fspick": (433, [-100, b"/tmp", 0]),
    "mount_setattr": (442, [-100, b"/tmp", 0, 0, 0]),
    "statmount": (457, [0, 0, 0, 0]),
    "listmount": (458, [0, 0, 0, 0]),
    "open_tree_attr": (467, [-100, b"/tmp", 0, 0, 0]),
    "ptrace(PTRACE_TRACEME)": (101, [0, 0, 0, 0]),
    "process_vm_readv": (310, [1, 0, 0, 0, 0, 0]),
    "process_vm_writev": (311, [1, 0, 0, 0, 0, 0]),
    "kcmp": (312, [1, 1, 0, 0, 0]),
    "pidfd_getfd": (438, [0, 0, 0]),
    "bpf": (321, [0, 0, 0]),
    "perf_event_open": (298, [0, 0, -1, -1, 0]),
    "userfaultfd": (323, [0]),
    "io_uring_setup": (425, [1, 0]),
    "io_uring_enter": (426, [0, 0, 0, 0, 0, 0]),
    "io_uring_register": (427, [0, 0, 0, 0]),
    "keyctl": (250, [0, 0]),
    "add_key": (248, [b"user", b"k", b"v", 1, 0]),
    "request_key": (249, [b"user", b"k", 0, 0]),
    "personality(query)": (135, [0xFFFFFFFF]),
    "modify_ldt": (154, [0, 0, 0]),
    "iopl": (172, [3]),
    "ioperm": (173, [0, 1, 1]),
    "name_to_handle_at": (303, [-100, b"/tmp", 0, 0, 0]),
    "open_by_handle_at": (304, [-100, 0, 0]),
    "fanotify_init": (300, [0, 0]),
    "migrate_pages": (256, [0, 0, 0, 0]),
    "move_pages": (279, [0, 0, 0, 0, 0, 0]),
    "uselib": (134, [b"/tmp"]),
    "kexec_load": (246, [0, 0, 0, 0]),
    "kexec_file_load": (320, [0, 0, 0, 0, 0]),
    "init_module": (175, [0, 0, b""]),
    "finit_module": (313, [0, b"", 0]),
    "delete_module": (176, [b"x", 0]),
    "reboot": (169, [0, 0, 0, 0]),
    "swapon": (167, [b"/tmp", 0]),
    "swapoff": (168, [b"/tmp"]),
    "acct": (163, [0]),
    "quotactl": (179, [0, 0, 0, 0]),
    "quotactl_fd": (443, [0, 0, 0, 0]),
    "syslog": (103, [10, 0, 0]),
    "vhangup": (153, []),
    "sethostname": (170, [b"x", 1]),
    "setdomainname": (171, [b"x", 1]),
    "settimeofday": (164, [0, 0]),
    "clock_settime": (227, [0, 0]),
    "clock_adjtime": (305, [0, 0]),
    "adjtimex": (159, [0]),
}
NOT_A_NAMESPACE = {  # refused with another errno, so glibc and Python fall back or report it
    "clone3": (435, [0, 0], errno.ENOSYS),
    "socket(AF_NETLINK)": (41, [16, 3, 0], errno.EAFNOSUPPORT),
    "socket(AF_PACKET)": (41, [17, 3, 0], errno.EAFNOSUPPORT),
    "socket(AF_VSOCK)": (41, [40, 1, 0], errno.EAFNOSUPPORT),
    "socket(AF_ALG)": (41, [38, 5, 0], errno.EAFNOSUPPORT),
    "socketpair(AF_INET)": (53, [2, 1, 0, 0], errno.EAFNOSUPPORT),
}

PROBE = '''
import ctypes, os
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
CALLS = {calls!r}

def call(number, args):
    ctypes.set_errno(0)
    result = LIBC.syscall(ctypes.c_long(number), *[
        arg if isinstance(arg, bytes) else ctypes.c_long(arg) for arg in args])
    if result == 0 and number == 56:  # a clone that went through: this is its child
        os._exit(0)
    if result > 0 and number == 56:  # its parent: reap the child now; after PTRACE_TRACEME its
        os.waitpid(result, 0)        # SIGCHLD would stop this traced worker, with no tracer
    return -ctypes.get_errno() if result == -1 else result


class ProbeEnv:
    def reset(self, seed=None):
        return "ready", {{}}

    def step(self, action):
        return "done", 0.0, True, False, {{name: call(*spec) for name, spec in CALLS.items()}}

    def solution(self):
        return ["x"]
'''


def probe(worker, calls: dict[str, tuple]) -> dict[str, int]:
    """{name: the call's result, or -errno} for each call, made from inside the jail."""
    source = PROBE.format(calls={name: spec[:2] for name, spec in calls.items()})
    for op, fields in (("load", {"source": source}), ("reset", {"seed": 0})):
        assert worker.call(op, **fields).ok
    reply = worker.call("step", action="probe")
    assert reply.ok, reply
    return reply.result[4]


def test_every_refused_syscall_gets_eperm(make_worker):
    results = probe(make_worker(call_timeout=10), REFUSED)
    assert {name: r for name, r in results.items() if r != -errno.EPERM} == {}


def test_clone3_and_odd_socket_families_get_their_own_errno(make_worker):
    results = probe(make_worker(call_timeout=10), NOT_A_NAMESPACE)
    expected = {name: -spec[2] for name, spec in NOT_A_NAMESPACE.items()}
    assert results == expected


def test_without_the_policy_the_same_calls_go_through(make_worker, monkeypatch):
    """The control: in the same jail under an allow-all policy, the refusals above vanish."""
    monkeypatch.setattr(jail, "SECCOMP_POLICY", "DEFAULT ALLOW")
    # clone first: after unshare the worker's uid is unmapped, which forbids nesting further
    calls = {name: REFUSED[name] for name in ("clone(CLONE_NEWUSER)", "unshare",
                                              "ptrace(PTRACE_TRACEME)", "personality(query)")}
    calls["socket(AF_NETLINK)"] = NOT_A_NAMESPACE["socket(AF_NETLINK)"]
    calls["clone3"] = NOT_A_NAMESPACE["clone3"]
    results = probe(make_worker(call_timeout=10), calls)
    assert results["unshare"] == 0 and results["ptrace(PTRACE_TRACEME)"] == 0
    assert results["personality(query)"] >= 0 and results["socket(AF_NETLINK)"] >= 0
    assert results["clone(CLONE_NEWUSER)"] > 0  # the child's pid
    assert results["clone3"] == -errno.EINVAL


def test_x32_syscall_numbers_do_not_slip_past_the_policy(make_worker):
    """kafel filters x86-64 numbers only; x32 ones (bit 30 set) must fail in the kernel."""
    x32_unshare = (0x40000000 | 272, [CLONE_NEWUSER])
    assert probe(make_worker(call_timeout=10), {"x32 unshare": x32_unshare}) \
        == {"x32 unshare": -errno.ENOSYS}


I386_UNSHARE = bytes([0x53,  # push rbx (callee-saved)
                      0xB8, 0x36, 0x01, 0x00, 0x00,  # mov eax, 310 (i386 unshare)
                      0xBB, 0x00, 0x00, 0x00, 0x10,  # mov ebx, CLONE_NEWUSER
                      0xCD, 0x80,  # int 0x80
                      0x5B, 0xC3])  # pop rbx; ret


def test_a_32_bit_syscall_kills_the_worker(make_worker, jailkit):
    """`int 0x80` uses the i386 table, where 310 is unshare: kafel kills any foreign ABI."""
    source = jailkit.env_source(prelude=f"import ctypes, mmap\nCODE = {I386_UNSHARE!r}\n", step="""
        memory = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        memory.write(CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
        result = ctypes.CFUNCTYPE(ctypes.c_int)(address)()
        return str(result), 0.0, True, False, {}
        """)
    worker = make_worker(call_timeout=5)
    assert worker.call("load", source=source).ok and worker.call("reset", seed=0).ok
    reply = worker.call("step", action="x")
    assert reply.outcome == "program_error" and reply.error["type"] == "exited", reply
    assert "SIGSYS" in reply.error["msg"] or "SIGSEGV" in reply.error["msg"], reply


def test_what_stdlib_envs_use_still_works(make_worker, jailkit):
    """Threads and fork (glibc falls back from clone3), unix and inet sockets, mmap, urandom."""
    source = jailkit.env_source(prelude="import mmap, os, socket, threading\n", step="""
        seen = []
        thread = threading.Thread(target=lambda: seen.append("thread"))
        thread.start()
        thread.join()
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        seen.append(f"child exit {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}")
        left, right = socket.socketpair()
        left.sendall(b"hi")
        seen.append(right.recv(2).decode())
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()
        seen.append(len(mmap.mmap(-1, 4096)))
        seen.append(len(os.urandom(8)))
        return repr(seen), 0.0, True, False, {}
        """)
    worker = make_worker(call_timeout=5)
    assert worker.call("load", source=source).ok and worker.call("reset", seed=0).ok
    reply = worker.call("step", action="x")
    assert reply.ok and reply.result[0] == "['thread', 'child exit 7', 'hi', 4096, 8]", reply
