"""The jailed worker: loads one environment program and answers requests about it.

In: JSON lines on stdin, one request each: {"op": "ping"}, {"op": "load", "source": ...}, {"op": "reset",
"seed": ...}, {"op": "step", "action": ...}, {"op": "solution"}, {"op": "tools"},
{"op": "criteria"}, {"op": "close"}.
Out: one JSON line per request on the protocol pipe (the original stdout):
{"ok": true, "result": ..., "shape": [type name, length]} or
{"ok": false, "error": {"type": ..., "msg": ..., "trace": ...}}.
Guarantees: whatever the env does (raise, print, read stdin, sys.exit), the protocol stays
intact: the env's own stdout and stderr go to the worker's stderr, stdin reads /dev/null.

Runs inside the jail under the system interpreter with `-s -S -P`, stdlib only. It is not a
security boundary by itself: the jail is. An env that writes to the protocol descriptor can only
lie about its own results, which validation and rollouts treat as data.
"""

import json
import math
import os
import sys
import traceback

MAX_TRACE = 2000


def open_protocol():
    """Keep private copies of stdin/stdout for the protocol; give the env harmless ones."""
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # env prints end up on stderr, which the parent caps and discards
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr
    return requests, replies


def jsonable(value, depth=0):
    """Coerce what an env returns into JSON; unknown objects become their repr."""
    if depth > 20:
        return repr(value)[:200]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, (list, tuple)):
        return [jsonable(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {str(key): jsonable(item, depth + 1) for key, item in value.items()}
    return {"__object__": type(value).__name__, "repr": repr(value)[:200]}


def shape(value):
    size = len(value) if isinstance(value, (tuple, list, dict, str)) else None
    return [type(value).__name__, size]


class Session:
    def __init__(self, base_dir):
        self.base_dir = base_dir
        self.env = None
        # compiled at start-up (which a worker pool overlaps with other work), not per load
        self.tool_base = self._tool_base()

    def load(self, source):
        namespace = {"__name__": "spade_env", "ToolUseBaseEnv": self.tool_base}
        code = compile(source, "<env>", "exec")
        exec(code, namespace)
        base = namespace["ToolUseBaseEnv"]
        classes = [obj for name, obj in namespace.items()
                   if isinstance(obj, type) and name.endswith("Env") and obj is not base
                   and getattr(obj, "__module__", None) == "spade_env"]
        if not classes:
            raise LookupError("no class whose name ends in 'Env'")
        cls = classes[0]
        self.env = cls()
        return {"class_name": cls.__name__,
                "domain": "tool_use" if issubclass(cls, base) else "game",
                "max_turns": getattr(self.env, "max_turns", None)}

    def _tool_base(self):
        path = os.path.join(self.base_dir, "tool_base.py")
        namespace = {"__name__": "spade_tool_base"}
        with open(path) as fh:
            exec(compile(fh.read(), path, "exec"), namespace)
        return namespace["ToolUseBaseEnv"]

    def handle(self, request):
        op = request.get("op")
        if op == "ping":
            return "pong"
        if op == "load":
            return self.load(request["source"])
        if self.env is None:
            raise RuntimeError("no env loaded")
        if op == "reset":
            return self.env.reset(seed=request.get("seed"))
        if op == "step":
            return self.env.step(request["action"])
        if op == "solution":
            return self.env.solution()
        if op == "tools":
            return self.env.get_tools()
        if op == "criteria":
            return self.env.criteria_status()
        if op == "close":
            close = getattr(self.env, "close", None)
            return close() if callable(close) else None
        raise ValueError(f"unknown op {op!r}")


def reply_for(session, request):
    try:
        result = session.handle(request)
        return {"ok": True, "result": jsonable(result), "shape": shape(result)}
    except MemoryError:
        return {"ok": False, "error": {"type": "MemoryError", "msg": "out of memory"}}
    except BaseException as exc:  # SystemExit and KeyboardInterrupt from env code are data too
        trace = traceback.format_exc()[-MAX_TRACE:]
        return {"ok": False, "error": {"type": type(exc).__name__, "msg": str(exc)[:500],
                                       "trace": trace}}


def main():
    requests, replies = open_protocol()
    session = Session(os.path.dirname(os.path.abspath(__file__)))
    for line in requests:
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            request = {"op": None}
        answer = reply_for(session, request)
        try:
            data = json.dumps(answer, allow_nan=False)
        except (TypeError, ValueError) as exc:
            data = json.dumps({"ok": False, "error": {"type": "EncodeError", "msg": str(exc)}})
        replies.write(data.encode("utf-8", "replace") + b"\n")
        if request.get("op") == "close":
            break


if __name__ == "__main__":
    main()
