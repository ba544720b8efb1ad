"""Every worker reply, checked once at the boundary before any stage sees it.

In: one reply line from a jailed worker (bytes an env may have forged), the op it answers and the
id of the request. Out: a `Reply`. Guarantees: nothing here raises on any input; an ok reply holds
only plain JSON values (dict, list, str, int, float, bool, None) in which
  - strings are valid UTF-8: undecodable bytes and lone surrogates became U+FFFD;
  - ints fit in 64 bits (what orjson writes), floats are finite, nesting is at most MAX_DEPTH;
  - the result has its op's type:
      ping      "pong"
      load      {"class_name": str, "domain": "game" | "tool_use", "max_turns": any}
      reset     [observation: str, info: dict]
      step      [observation: str, reward: int | float, terminated: bool, truncated: bool,
                 info: dict]
      solution  list of str, str, or a number
      tools     list of at most MAX_TOOLS {"type": "function", "function": {"name": str, ...}},
                each at most TOOL_BYTES of JSON
      criteria  list of (bool | str)
      close     anything
  - `shape` is [kind, length] as the worker saw the returned object; kind "tuple" or "list"
    means the result is a list of that length.
An error reply keeps `type` and `msg` (one line each) and `trace` as bounded strings. A reply of
the wrong type is a `program_error` of type `bad_reply` whose msg says what is wrong in one line
(the worker lives on); a line that is not a reply to this request (not JSON, forged, out of
order) is a `program_error` of type `protocol` (the caller must stop the worker: the stream is
out of step). Sizes: a reply line is at most `Limits.reply_bytes` (the caller reads no more).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32
MAX_TOOLS = 64
TOOL_BYTES = 16 << 10
INT_RANGE = (-(1 << 63), (1 << 64) - 1)
ERROR_FIELDS = {"type": 100, "msg": 1000, "trace": 4000}  # longest kept, in characters
DOMAINS = ("game", "tool_use")

_ALWAYS_PLAIN = frozenset({str, bool, type(None)})
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_LINE_BREAKS = re.compile(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")


@dataclass
class Reply:
    outcome: str
    result: Any = None
    shape: list | None = None
    error: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class BadReply(ValueError):
    """What is wrong with a reply, in one line; `where` is the path to the bad value."""

    def __init__(self, msg: str, where: str = ""):
        super().__init__(msg)
        self.msg, self.where = msg, where

    def at(self, step: str) -> "BadReply":
        self.where = step + self.where
        return self


def check(op: str, request_id: int, line: bytes) -> Reply:
    """The Reply for one line read from the worker in answer to request `request_id` (`op`)."""
    try:
        message = json.loads(line.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return _protocol("the worker sent a line that is not JSON")
    if type(message) is not dict or type(message.get("id")) is not int \
            or message["id"] != request_id or type(message.get("ok")) is not bool:
        return _protocol("the worker sent a line that is not the reply to this request")
    try:
        if _SURROGATE_ESCAPE.search(line):
            message = _without_surrogates(message, 0)
        if not message["ok"]:
            return Reply("program_error", error=_error(message.get("error")))
        result = plain(message.get("result"))
        checked = RESULT_CHECKS.get(op, _anything)(result)
        return Reply("ok", checked, _shape(message.get("shape"), result))
    except BadReply as exc:
        where = f" at {_named(op, exc.where)}" if exc.where else ""
        return Reply("program_error", error={"type": "bad_reply", "msg": f"{op}: {exc.msg}{where}"})


def _protocol(msg: str) -> Reply:
    return Reply("program_error", error={"type": "protocol", "msg": msg})


# -- plain values ------------------------------------------------------------------------------

def plain(value: Any, depth: int = 0) -> Any:
    """`value` (as json.loads made it) if every number in it is finite and 64-bit and it nests
    at most MAX_DEPTH deep; raises BadReply otherwise."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if not INT_RANGE[0] <= value <= INT_RANGE[1]:
            raise BadReply(f"an int of {value.bit_length()} bits (more than 64)")
        return value
    if kind is float:
        if not math.isfinite(value):
            raise BadReply(f"a non-finite number ({value})")
        return value
    if depth >= MAX_DEPTH:
        raise BadReply(f"values nested more than {MAX_DEPTH} deep")
    for where, item in enumerate(value) if kind is list else value.items():
        if type(item) not in _ALWAYS_PLAIN:  # a call per str or bool would double the cost
            try:
                plain(item, depth + 1)
            except BadReply as exc:
                raise exc.at(f"[{where}]" if kind is list else f"[{where[:40]!r}]") from None
    return value


def _without_surrogates(value: Any, depth: int) -> Any:
    """A copy of `value` with every lone surrogate (a "\\udXXX" escape json.loads kept, which
    orjson refuses to write) replaced by U+FFFD."""
    kind = type(value)
    if kind is str:
        return _SURROGATE.sub("\ufffd", value)
    if depth > MAX_DEPTH:  # plain() rejects it afterwards
        return value
    if kind is list:
        return [_without_surrogates(item, depth + 1) for item in value]
    if kind is dict:
        return {_SURROGATE.sub("\ufffd", key): _without_surrogates(item, depth + 1)
                for key, item in value.items()}
    return value


def _shape(shape: Any, result: Any) -> list:
    if type(shape) is not list or len(shape) != 2 or type(shape[0]) is not str \
            or not (shape[1] is None or type(shape[1]) is int):
        raise BadReply("the reply has no [kind, length] shape")
    kind, size = shape[0][:100], shape[1]
    if (kind in ("tuple", "list")) != (type(result) is list) \
            or type(result) is list and size != len(result):
        raise BadReply(f"its shape {kind} of length {size} does not match its result")
    return [kind, size]


def _error(error: Any) -> dict[str, str]:
    if type(error) is not dict or type(error.get("type")) is not str \
            or type(error.get("msg")) is not str:
        raise BadReply("an error reply without a type and a message")
    kept = {field: error[field][:limit] for field, limit in ERROR_FIELDS.items()
            if type(error.get(field)) is str}
    for field in ("type", "msg"):  # one line each, as every message to a user is
        kept[field] = _LINE_BREAKS.sub(" ", kept[field])
    return kept


# -- the result of each op ---------------------------------------------------------------------

def kind_of(value: Any) -> str:
    """A value's type in the words of the env's own Python (the worker marks what JSON lacks)."""
    if type(value) is dict and type(value.get("__float__")) is str:
        return f"float {value['__float__'][:20]}"
    if type(value) is dict and type(value.get("__object__")) is str:
        return value["__object__"][:100]
    return {str: "str", int: "int", float: "float", bool: "bool", list: "list",
            dict: "dict"}.get(type(value), "NoneType")


def _ping(result: Any) -> Any:
    if result != "pong":
        raise BadReply("the worker did not answer 'pong'")
    return result


def _load(result: Any) -> Any:
    if type(result) is not dict or type(result.get("class_name")) is not str \
            or result.get("domain") not in DOMAINS:
        raise BadReply("the worker's load facts lack class_name and domain")
    return {"class_name": result["class_name"][:200], "domain": result["domain"],
            "max_turns": result.get("max_turns")}


def _reset(result: Any) -> Any:
    if type(result) is not list or len(result) != 2:
        raise BadReply(f"must return (observation, info), got {_describe(result)}")
    _field("observation", result[0], str)
    _field("info", result[1], dict)
    return result


STEP_FIELDS = ("observation", "reward", "terminated", "truncated", "info")


def _step(result: Any) -> Any:
    if type(result) is not list or len(result) != 5:
        raise BadReply("must return (observation, reward, terminated, truncated, info), got "
                       f"{_describe(result)}")
    observation, reward, terminated, truncated, info = result
    _field("observation", observation, str)
    if type(reward) not in (int, float):
        raise BadReply(f"reward must be a number, got {kind_of(reward)}")
    _field("terminated", terminated, bool)
    _field("truncated", truncated, bool)
    _field("info", info, dict)
    return result


def _solution(result: Any) -> Any:
    if type(result) in (str, int, float):  # a number: a bare answer (sandbox/contract.py)
        return result
    if type(result) is not list:
        raise BadReply(f"must return a list of action strings, got {kind_of(result)}")
    for index, action in enumerate(result):
        if type(action) is not str:
            raise BadReply(f"action {index} is {kind_of(action)}, not str")
    return result


def _tools(result: Any) -> Any:
    if type(result) is not list:
        raise BadReply(f"get_tools() must return a list of tool schemas, got {kind_of(result)}")
    if len(result) > MAX_TOOLS:
        raise BadReply(f"{len(result)} tools, more than {MAX_TOOLS}")
    for index, tool in enumerate(result):
        function = tool.get("function") if type(tool) is dict else None
        if type(function) is not dict or tool.get("type") != "function" \
                or type(function.get("name")) is not str or not function["name"]:
            raise BadReply(f'tool {index} is not {{"type": "function", "function": '
                           '{"name": ...}}')
        if len(json.dumps(tool)) > TOOL_BYTES:
            raise BadReply(f"tool {index} ({function['name'][:40]!r}) is more than "
                           f"{TOOL_BYTES // 1024} KiB of JSON")
    return result


def _criteria(result: Any) -> Any:
    if type(result) is not list or not all(type(v) in (bool, str) for v in result):
        raise BadReply("criteria_status() must return a list of bools (or error strings)")
    return result


def _anything(result: Any) -> Any:
    return result


RESULT_CHECKS = {"ping": _ping, "load": _load, "reset": _reset, "step": _step,
                 "solution": _solution, "tools": _tools, "criteria": _criteria,
                 "close": _anything}


def _field(name: str, value: Any, kind: type) -> None:
    if type(value) is not kind:
        raise BadReply(f"{name} must be {kind.__name__}, got {kind_of(value)}")


def _named(op: str, where: str) -> str:
    """Path "[1]" of a step result reads "reward", "[4]['x']" reads "info['x']"."""
    names = {"reset": ("observation", "info"), "step": STEP_FIELDS}.get(op)
    head, bracket, rest = where.partition("]")
    if names and head[1:].isdigit() and int(head[1:]) < len(names):
        return names[int(head[1:])] + rest
    return where


def _describe(result: Any) -> str:
    if type(result) is list:
        return f"{len(result)} values ({', '.join(kind_of(v) for v in result[:6])})"
    return kind_of(result)
