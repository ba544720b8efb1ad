"""The jailed worker: loads one environment program and answers requests about it.

In: JSON lines on stdin, one request each, with an "id" the reply echoes: {"op": "ping"},
{"op": "load", "source": ...}, {"op": "reset", "seed": ...}, {"op": "step", "action": ...},
{"op": "solution"}, {"op": "tools"}, {"op": "criteria"}, {"op": "close"}.
Out: one JSON line per request on the protocol pipe (the original stdout):
{"id": ..., "ok": true, "result": ..., "shape": [kind, length]} or
{"id": ..., "ok": false, "error": {"type": ..., "msg": ..., "trace": ...}}.
The result holds plain JSON types only, made here from what the env returned without calling the
env's own methods: an exact str, int or float, lists for tuples and lists, dicts with str keys;
a non-finite float becomes {"__float__": "nan"}, any other object {"__object__": type name,
"repr": ...}. `kind` is "tuple", "list", "dict" or "str" for those (and their subclasses),
otherwise the type's name. An env error's msg ends with where in the env it happened:
`division by zero (env.py:42: return 1/0)`.
The env class is the one the static checks read (sandbox/env_class.py: exactly one top-level
`*Env` class statement), and it is played only while it is what that statement built: plain
classes of the module shaped by the static rules, the methods the worker and the base call
the defs of those names, its bases the ones named, the injected base class and its module
unchanged, the env an instance of that class (`Guard`, checked after the module runs and after
every request; a change is an `EnvClassError` for that request and every later one, which
validation reports as `structure`).
What the jail refuses, the worker also names: an audit hook (`refusal_hook`, installed before
any env code runs) stops and records the first attempt to signal another process or process
group, to create a process (fork, spawn, exec, system, subprocess), to open a socket other than
AF_UNIX, to reach C functions through ctypes (how unshare, setns, mount or ptrace would be
called on this Python) or, on a Python that has them, os.unshare and os.setns; and what would
reach the worker's own state from inside (gc's object lists, trace and profile functions,
other threads' frames). From then on every request answers `RefusedOperation` naming it, so
validation rejects the env (check `policy`) whether or not the jail would have let the attempt
do anything. The record cannot be cleared or switched off from env code: the hook reads no
global (its builtins are bound in its closure, its event names are constants of its code),
keeps the record in a list only its closure holds, never calls env code (it reads exact builtin
types only), and is reachable only through what it refuses; the request loop (`serve`) asks it
after every request with the audit event REFUSALS_QUERY, through locals bound before any env
code ran (an env can rebind this module's globals and patch its classes, not a running
function's locals), so rebinding the hook's names, replacing the worker's functions or their
code, patching its classes or emptying lists its frames reach all leave the naming as it was.
What it misses: attempts that raise no audit event (a C extension's own calls,
`_posixsubprocess.fork_exec` called directly), and lines an env writes onto the protocol
descriptor itself (a forged reply the parent reads first: the worker's own reply then arrives
out of step, a `protocol` program_error, not `policy`); the jail still refuses those calls
(seccomp, namespaces, no network), it only does not name them.
Guarantees: whatever the env does (raise, print, read stdin, sys.exit, patch json, os or this
module), the replies are written by functions and descriptors `serve` bound before any env code
ran; the env's own stdout and stderr go to the worker's stderr, stdin reads /dev/null.

Runs inside the jail under the system interpreter with `-s -S -P`, stdlib only. It is not a
security boundary by itself: the jail is. An env can still write onto the protocol descriptor
or patch this module's classes and functions (it is __main__) and so change what its own
replies say, or what the guard reports; the parent checks every reply (sandbox/replies.py),
and validation plays what the worker replies.
"""

import json
import linecache
import math
import os
import sys
import traceback
from _ast import PyCF_ONLY_AST
# Module globals shadow builtins: an env that patches builtins.isinstance & co. misses these.
from builtins import (BaseException, MemoryError, PermissionError, StopIteration, SyntaxError,
                      ValueError, callable, getattr, isinstance, issubclass, len, repr, str, type)

MAX_TRACE = 2000
MAX_DEPTH = 20  # deeper values are sent as their repr
ENV_FILE = "env.py"  # the filename env code is compiled under: tracebacks and messages cite it

# Taken before any env code runs, so an env that patches json, os or sys cannot reach them.
_encode = json.encoder.c_make_encoder(
    None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False)
_scan = json.JSONDecoder().scan_once  # the C scanner itself: patching JSONDecoder misses it
_write = os.write
_str, _int_of, _float_of = str.__str__, int.__int__, float.__float__
_list_items, _tuple_items, _dict_items = list.__iter__, tuple.__iter__, dict.items
_type_name = type.__dict__["__name__"].__get__  # a metaclass cannot override this one


REFUSALS_QUERY = "spade.refusals"  # the audit event the worker asks the hook's record with


def refusal_hook(own_pid, query=REFUSALS_QUERY, type=type, str=str, int=int, tuple=tuple,
                 len=len, repr=repr, PermissionError=PermissionError):
    """The audit hook: it refuses (raises PermissionError) and records what the jail refuses,
    and what would reach the worker's own state; asked with the event REFUSALS_QUERY, it raises
    PermissionError holding the first refusal ("" when none), so the hook alone keeps its
    record. Nothing it does can be changed from env code: it reads no global (its builtins are
    bound here, its event names are constants of its code), its record is a list only its
    closure holds, it touches only values of exact builtin types (never env code, which could
    reach its frame), and the only ways to the hook itself, gc's object lists and trace
    functions, are among what it refuses."""
    found = []

    def shown(value):
        return repr(value)[:60] if type(value) is str or type(value) is int else "?"

    def refused(event, args):
        """What an audit event tries, in words, or None."""
        if type(args) is not tuple:
            return None
        if event == "os.kill" and len(args) == 2:
            pid, sig = args
            if type(pid) is int and pid == own_pid:
                return None  # a signal to itself
            return f"os.kill(pid={shown(pid)}, sig={shown(sig)}): a signal to another process"
        if event == "os.killpg" and len(args) == 2:
            return (f"os.killpg(pgid={shown(args[0])}, sig={shown(args[1])}): a signal to a "
                    "process group")
        if event in {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
                     "os.system", "os.startfile", "subprocess.Popen"}:
            return f"{event}: creating a process"
        if event in {"os.unshare", "os.setns"}:  # Python 3.12 and later
            return f"{event}: entering or making a namespace"
        if event == "socket.__new__" and len(args) > 1 and not (type(args[1]) is int
                                                                and args[1] == 1):
            return f"socket(family={shown(args[1])}): a socket other than AF_UNIX"
        if event.startswith("ctypes."):
            symbol = f"({shown(args[1])})" if event == "ctypes.dlsym" and len(args) > 1 else ""
            return f"{event}{symbol}: calling C functions directly"
        if event in {"gc.get_objects", "gc.get_referrers", "gc.get_referents"}:
            return f"{event}: reaching objects the env was not handed (the worker's own)"
        if event in {"sys.settrace", "sys.setprofile", "sys._current_frames",
                     "sys._current_exceptions"}:
            return f"{event}: reaching into the worker's own frames"
        return None

    def hook(event, args):
        if event == query:
            raise PermissionError(found[0] if found else "")
        what = refused(event, args)
        if what is not None:
            if not found:
                found.append(what)
            raise PermissionError(f"refused by spade: {what}")

    return hook


def open_protocol():
    """Keep private copies of stdin/stdout for the protocol; give the env harmless ones."""
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # env prints end up on stderr, which the parent caps and discards
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr
    return requests, replies


def plain(value, depth=0):
    """What an env returned, as plain JSON values, read through the base types' own slots (a
    subclass's overrides never run)."""
    kind = type(value)
    if value is None or kind is bool:
        return value
    if issubclass(kind, str):
        return _str(value)
    if issubclass(kind, int):
        return _int_of(value)
    if issubclass(kind, float):
        number = _float_of(value)
        return number if math.isfinite(number) else {"__float__": repr(number)}
    if depth < MAX_DEPTH:
        if issubclass(kind, list):
            return [plain(item, depth + 1) for item in _list_items(value)]
        if issubclass(kind, tuple):
            return [plain(item, depth + 1) for item in _tuple_items(value)]
        if issubclass(kind, dict):
            return {key_text(key): plain(item, depth + 1) for key, item in _dict_items(value)}
    return {"__object__": _type_name(kind), "repr": safe_text(value, repr, 200)}


def key_text(key):
    """A dict key as JSON writes it: str as is, numbers, bools and None as JSON spells them."""
    kind = type(key)
    if issubclass(kind, str):
        return _str(key)
    if key is None or kind is bool or issubclass(kind, (int, float)):
        return "".join(_encode(plain(key), 0))
    return safe_text(key, repr, 200)


def safe_text(value, render, limit):
    """render(value) (str or repr, which run env code) as an exact str, or a note if it fails."""
    try:
        return _str(render(value))[:limit]
    except BaseException:  # noqa: BLE001 - env code may raise anything, SystemExit included
        return f"<{_type_name(type(value))} that cannot be shown>"


def shape(value, converted):
    """[kind, length] of what the env returned; `converted` is plain(value)."""
    kind = type(value)
    for base in (tuple, list, dict, str):
        if issubclass(kind, base):
            return [base.__name__, len(converted)]
    return [_type_name(kind), None]


class Session:
    def __init__(self, base_dir):
        self.base_dir = base_dir
        self.env = None
        self.source_lines = []
        self.compiled = {}  # filename -> code: each copy of a module is run from one compile
        # compiled at start-up (which a worker pool overlaps with other work), not per load
        self.tool_base = self._module("tool_base.py")["ToolUseBaseEnv"]
        # the base class of envs in the reference code's format (sandbox/reference_tool_base.py)
        self.reference_base = self._module("reference_tool_base.py")["ToolUseBaseEnv"]
        # The reset gate, the class's construction, the names injected and the reading of a
        # reference-format solution run from second, private copies of the base modules that env
        # code never sees, so redefining a method, the injected base class or its module changes
        # nothing.
        private = self._module("reference_tool_base.py")
        own = self._module("tool_base.py")
        self.sealed = own["internal_names"]()  # what our tool-use API's subclasses never redefine
        self.gates = {False: own["criteria_status"],
                      True: private["criteria_status"]}
        self.reference_api, self.common_names = private["reference_api"], private["common_names"]
        self.build, self.takes_max_turns = private["build"], private["takes_max_turns"]
        self.reference_solution = private["solution_actions"]
        self.Guard = self._module("env_class.py")["Guard"]
        self.guard = None
        self.reference = False  # whether the loaded env targets the reference's tool-use API
        self.cls, self.fresh_episodes = None, False

    def load(self, source):
        self.source_lines = source.splitlines(True)
        # tracebacks through env code show its lines (mtime None: linecache never re-reads it)
        linecache.cache[ENV_FILE] = (len(source), None, self.source_lines, ENV_FILE)
        tree = compile(source, ENV_FILE, "exec", PyCF_ONLY_AST)
        self.reference = self.reference_api(tree)
        if "math_verify" in source:  # what the reference's game templates import: our stand-in
            sys.modules["math_verify"] = type(sys)("math_verify")
            self._module("math_verify_shim.py", sys.modules["math_verify"].__dict__)
        namespace = {**self.common_names(source), "__name__": "spade_env",
                     "ToolUseBaseEnv": self.reference_base if self.reference else self.tool_base}
        base = namespace["ToolUseBaseEnv"]
        code = compile(tree, ENV_FILE, "exec")
        # The class played is the one class statement the static checks read (the same rule,
        # sandbox/env_class.py), proved unchanged once the module has run and after every request.
        guard = self.Guard(tree, code, namespace, base, frozenset() if self.reference
                           else self.sealed)
        exec(code, namespace)
        cls = self.cls = guard.loaded()
        self.guard = guard
        self.fresh_episodes = self.takes_max_turns(cls)  # as the reference plays such a class
        self.env = self.build(cls)
        return {"class_name": _type_name(cls),
                "domain": "tool_use" if issubclass(cls, base) else "game",
                "max_turns": getattr(self.env, "max_turns", None)}

    def _module(self, filename, namespace=None):
        """The namespace of one of the worker's files, run (into `namespace`, when given)."""
        path = os.path.join(self.base_dir, filename)
        namespace = {"__name__": "spade_" + filename[:-3]} if namespace is None else namespace
        if filename not in self.compiled:
            with open(path) as fh:
                self.compiled[filename] = compile(fh.read(), path, "exec")
        exec(self.compiled[filename], namespace)
        return namespace

    def handle(self, request):
        result = self._handle(request)
        if self.guard is not None and request.get("op") != "close":
            self.guard.check(self.env)  # an env that changed its class while playing plays no more
        return result

    def _handle(self, request):
        op = request.get("op")
        if op == "ping":
            return "pong"
        if op == "load":
            return self.load(request["source"])
        if self.env is None:
            raise RuntimeError("no env loaded")
        if op == "reset":
            if self.fresh_episodes:
                self.env = self.build(self.cls)
            return self.env.reset(seed=request.get("seed"))
        if op == "step":
            return self.env.step(request["action"])
        if op == "solution":
            return self.reference_solution(self.env) if self.reference else self.env.solution()
        if op == "tools":
            return self.env.get_tools()
        if op == "criteria":
            return self.gates[self.reference](self.env)
        if op == "close":
            close = getattr(self.env, "close", None)
            return close() if callable(close) else None
        raise ValueError(f"unknown op {op!r}")

    def where(self, exc):
        """' (env.py:LINE: source text)' for the innermost env line `exc` passed through."""
        line = None
        try:
            if isinstance(exc, SyntaxError) and exc.filename == ENV_FILE:
                line = exc.lineno
            tb = exc.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == ENV_FILE:
                    line = tb.tb_lineno
                tb = tb.tb_next
        except BaseException:  # noqa: BLE001 - an env can make these attributes raise
            return ""
        if type(line) is not int or not 0 < line <= len(self.source_lines):
            return ""
        text = self.source_lines[line - 1].strip()
        return f" ({ENV_FILE}:{line}: {text[:80]}{'...' if len(text) > 80 else ''})"


def reply_for(session, request):
    try:
        result = session.handle(request)
        converted = plain(result)
        return {"ok": True, "result": converted, "shape": shape(result, converted)}
    except MemoryError:
        return {"ok": False, "error": {"type": "MemoryError", "msg": "out of memory"}}
    except BaseException as exc:  # SystemExit and KeyboardInterrupt from env code are data too
        try:
            trace = traceback.format_exc()[-MAX_TRACE:]
        except BaseException:  # noqa: BLE001 - formatting calls the exception's own __str__
            trace = ""
        return {"ok": False, "error": {
            "type": _type_name(type(exc)),
            "msg": safe_text(exc, str, 500) + session.where(exc), "trace": trace}}


def main():
    requests, replies = open_protocol()
    session = Session(os.path.dirname(os.path.abspath(__file__)))
    named = os.environ.get("SPADE_NAME_REFUSALS") != "0"  # off only in tests of the jail itself
    if named:  # after the worker's own set-up, before any env code
        sys.addaudithook(refusal_hook(os.getpid()))
    serve(requests, replies, session, named)


def serve(requests, replies, session, named, audit=sys.audit, query=REFUSALS_QUERY, scan=_scan,
          encode=_encode, write=_write, answer_to=reply_for, unreadable=(ValueError, StopIteration),
          unencodable=(TypeError, ValueError, RecursionError), refusal=PermissionError,
          failure=BaseException, dict=dict, str=str, isinstance=isinstance,
          memoryview=memoryview):
    """Answer requests until `close` or the end of input. Reads nothing but its arguments, bound
    when this module was loaded: an env can rebind this module's globals (it is __main__) and
    patch its classes, but not the locals of a running function (only a trace function could,
    and sys.settrace is refused), so after every request the hook's record is asked (`named`)
    and a refusal answered, and every reply written, whatever the env did."""
    for line in requests:
        try:
            request = scan(line.decode("utf-8"), 0)[0]
        except unreadable:
            request = None
        if not isinstance(request, dict):
            request = {"op": None}
        try:
            answer = {"id": request.get("id"), **answer_to(session, request)}
        except failure:  # the env broke the worker's own reply path: the hook still answers
            answer = {"id": request.get("id"), "ok": False, "error": {
                "type": "WorkerError", "msg": "the env broke the worker's reply to this request"}}
        if named:
            try:
                audit(query)
                first = "the worker's audit hook no longer answers: the env tampered with it"
            except refusal as exc:
                first = exc.args[0]
            if first:  # named whatever the env made of the attempt, and every time after
                answer = {"id": request.get("id"), "ok": False,
                          "error": {"type": "RefusedOperation", "msg": first}}
        try:
            text = "".join(encode(answer, 0))
        except unencodable as exc:  # e.g. an int of 5000 digits
            text = "".join(encode({"id": request.get("id"), "ok": False, "error": {
                "type": "EncodeError", "msg": str(exc)[:300]}}, 0))
        data = memoryview(text.encode("ascii") + b"\n")
        while data:
            data = data[write(replies, data):]
        if request.get("op") == "close":
            break


if __name__ == "__main__":
    main()
