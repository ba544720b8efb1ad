"""Helper processes: package code on model-chosen input, run apart from the eval process.

In: a kind (which packages the fork server preloads: "rg" Reasoning-Gym, "bfcl", "math"
math-verify), the handler class the helper runs (each suite passes its own: rg.py its
Reasoning-Gym instances and scoring, bfcl.py one BFCL entry's simulated APIs and checker,
aime.py math-verify), a per-request timeout and an address-space cap.
`Helper.request(op, *args)` calls that method of the handler in the helper. Imports go one way:
the suites import this module, never the reverse (the handler class reaches the helper
process pickled by reference, and is imported there).
Out: the method's return value; HelperTimeout when a request runs past its timeout (the helper
is killed and restarted on the next request), HelperError when it raised or the helper died.
Why: RG scorers `eval()` or sympy-parse some answers, math-verify sympy-parses them, and
simulated APIs take model-chosen arguments (e.g. an mpmath precision), so a reply can make them
hang or eat memory. Helpers run under multiprocessing forkserver with `_helper_main` (this
module) as the target; stdout is sent to /dev/null there (stdout carries records only). The
fork server is started with PYTHONHASHSEED=HASH_SEED, so every helper has the same hash seed
whatever the eval process's is: RG instances drawn there are the same in every run. This
protects the run, it is NOT a security boundary (see the RG and BFCL modules for the input
checks on top of it).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

HASH_SEED = "0"  # the hash seed of every helper process
_start_lock = threading.Lock()


class HelperTimeout(RuntimeError):
    """A helper request ran past its timeout (the helper was killed)."""


class HelperError(RuntimeError):
    """The request raised inside the helper, or the helper died."""


_PRELOAD = {
    "rg": ["reasoning_gym"],
    "math": ["math_verify"],
    "bfcl": ["bfcl_eval.utils", "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
             *(f"bfcl_eval.eval_checker.multi_turn_eval.func_source_code.{m}" for m in (
                 "gorilla_file_system", "math_api", "message_api", "posting_api", "ticket_api",
                 "trading_bot", "travel_booking", "vehicle_control"))],
}


def _context(kind: str):
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    # Only the first call in a process counts (the fork server then exists); later kinds
    # import their modules in each child instead, which is merely slower.
    # "stages.evaluate" imports every module of the package, this one (`_helper_main`) included.
    ctx.set_forkserver_preload(["stages.evaluate", *_PRELOAD.get(kind, [])])
    _start_fork_server()
    return ctx


def _start_fork_server() -> None:
    """Start the fork server (once per process) with the helpers' fixed hash seed: it passes
    its environment, and its hash secret, to every helper it forks."""
    from multiprocessing import forkserver

    with _start_lock:
        before = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        try:
            forkserver.ensure_running()
        finally:
            if before is None:
                del os.environ["PYTHONHASHSEED"]
            else:
                os.environ["PYTHONHASHSEED"] = before


class Helper:
    """One helper process running package code on model-chosen input; requests time out."""

    def __init__(self, kind: str, handler: type, timeout: float, memory_mb: int = 8192):
        """`handler`: a class of a module-level name, made with no arguments in the helper."""
        self.kind, self.handler, self.timeout, self.memory_mb = kind, handler, timeout, memory_mb
        self.proc = None
        self.conn = None

    def request(self, op: str, *args: Any, timeout: float | None = None) -> Any:
        if self.proc is None:
            ctx = _context(self.kind)
            self.conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=_helper_main, args=(child, self.handler, self.memory_mb),
                                    daemon=True)
            self.proc.start()
            child.close()
        try:
            self.conn.send((op, args))
            if not self.conn.poll(timeout or self.timeout):
                self.close()
                raise HelperTimeout(f"{op} took longer than {timeout or self.timeout:g}s")
            status, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.close()
            raise HelperError(f"helper process died during {op}: {exc or type(exc).__name__}")
        if status != "ok":
            raise HelperError(value)
        return value

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)
            self.conn.close()
            self.proc = self.conn = None

    def __enter__(self) -> "Helper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _helper_main(conn, handler_class: type, memory_mb: int) -> None:
    import resource

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # package code prints; stdout carries records only
    sys.stdout = open(os.devnull, "w")
    limit = memory_mb << 20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        handler = handler_class()
    except BaseException as exc:  # e.g. rg's handler refusing an unfixed hash seed
        handler, failure = None, f"{type(exc).__name__}: {str(exc)[:400]}"
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        op, args = message
        if handler is None:
            conn.send(("error", failure))
            continue
        try:
            reply = ("ok", getattr(handler, op)(*args))
        except BaseException as exc:  # MemoryError, RecursionError, anything the package raises
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:400]}")
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable reply
            conn.send(("error", f"reply not sendable: {type(exc).__name__}"))
