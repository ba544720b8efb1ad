"""ToolUseBaseEnv: the base class every tool-use environment subclasses.

In: a designer-written subclass that defines `setup()` and `tool_<name>(**kwargs) -> str` methods.
Out: a game-shaped env (`reset`/`step`/`solution`) the agent plays through tool calls.
Guarantees: `step` never raises on malformed agent output; a format error costs `FORMAT_PENALTY`
and does not end the episode; the episode terminates only once every instruction's success
criterion holds and the agent answers `<answer>done</answer>`.

The jail worker injects this class into the env module's namespace, so generated code uses the
name `ToolUseBaseEnv` without importing it. Stdlib only: it runs inside the jail.

What a subclass sets in `setup()` (called by `reset`, with `self.rng` already seeded):
    self.state        dict, the hidden world the tools read and change
    self.instructions list of 3-5 user requests, revealed one at a time
    self.criteria     list of callables `state -> bool`, one per instruction
    self.tools        optional {name: {"description": str, "parameters": JSON-schema object}};
                      left empty, every `tool_<name>` method is a tool described by its own
                      signature and docstring (`tools_from_methods`), so a designer writes no
                      nested schema dicts (3 of 12 coder designs failed on one `}` too many)

`solution()` builds its actions with `self.call(name, **arguments)` and `self.finish()`, so a
designer never writes the `<tool_call>` tags (a model's chat template may treat them as special
tokens and end its turn there). Ending is this class's protocol, not the design: the checks
replay a solution whose last action does not finish (`finishes`) with `self.finish()` appended
(3 of 24 coder designs met every criterion and left it out).

A subclass defines only `setup`, `solution`, `max_turns`, `tool_<name>` methods, its own private
helpers, and optionally `__init__` and `close` (DESIGNER_NAMES); validation rejects a class that
redefines any other name of this base class (`internal_names()`), such as `reset`, `step` or
`_advance`: those are what make every tool-use env play, and be checked, the same way.
The reset gate (`criteria_status`) is a module function, not a method: the jail worker calls it
from a private copy of this module that env code never sees, and it reads the instance's own
`criteria` and `state`, so no override of a method, the base class or this module changes it.
"""

import json
import random
import re

FORMAT_PENALTY = -0.1
DESIGNER_NAMES = frozenset({"setup", "solution", "max_turns", "__init__", "close"})
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
ANSWER_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)
FINISH = "<answer>done</answer>"


class ToolUseBaseEnv:
    max_turns = 20

    def __init__(self, **kwargs):
        self.tools, self.state, self.instructions, self.criteria = {}, {}, [], []
        self.current = 0
        self.turns = 0

    # -- the part a designer writes -------------------------------------------------------
    def setup(self):
        raise NotImplementedError("a tool-use env defines setup()")

    # -- the game contract ------------------------------------------------------------------
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.setup()
        if not self.tools:
            self.tools = tools_from_methods(type(self))
        elif not isinstance(self.tools, dict):
            raise TypeError(f"self.tools is a {type(self.tools).__name__}: leave it out (the "
                            "tool_<name> methods are the tools) or make it a dict")
        self.current = 0
        self.turns = 0
        return self._instruction_text(0), {"tools": self.get_tools()}

    def step(self, action):
        self.turns += 1
        action = action if isinstance(action, str) else str(action)
        calls = TOOL_CALL_RE.findall(action)
        answer = ANSWER_RE.search(action)
        if calls:
            return self._run_calls(calls)
        if answer:
            return self._answer(answer.group(1).strip())
        return self._reply(
            "Format error: call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}"
            "</tool_call> or finish with <answer>done</answer>.",
            FORMAT_PENALTY,
            error="format",
        )

    # -- for solution(): actions without writing the tags --------------------------------
    def call(self, tool, /, **arguments):
        """The action that calls `tool` with `arguments`: `self.call("find_order",
        order_id=oid)` is `<tool_call>{"name": "find_order", ...}</tool_call>` (positional
        `tool`, so a tool may have a parameter of any name, `name` and `tool` included)."""
        return "<tool_call>" + json.dumps({"name": tool, "arguments": arguments}) + \
            "</tool_call>"

    def finish(self):
        """The action that ends the episode once every request is fulfilled."""
        return FINISH

    def get_tools(self):
        return [
            {"type": "function", "function": {"name": name, **spec}}
            for name, spec in self.tools.items()
        ]

    def close(self):
        pass

    # -- internals --------------------------------------------------------------------------
    def _run_calls(self, calls):
        outputs = []
        for raw in calls:
            try:
                call = json.loads(raw)
                name, arguments = call["name"], call.get("arguments", {})
                if isinstance(arguments, str):
                    arguments = json.loads(arguments)
                if not isinstance(arguments, dict):
                    raise TypeError("arguments must be an object")
            except (ValueError, KeyError, TypeError) as exc:
                return self._reply(f"Format error: bad tool call ({exc}).", FORMAT_PENALTY,
                                   error="format")
            outputs.append(self.execute_tool(name, arguments)["output"])
        return self._reply("\n".join(outputs) + self._advance(), self._progress())

    def execute_tool(self, name, arguments):
        method = getattr(self, f"tool_{name}", None)
        if name not in self.tools or method is None:
            return {"output": f"Error: unknown tool '{name}'.", "returncode": 1}
        try:
            return {"output": str(method(**arguments)), "returncode": 0}
        except TypeError as exc:
            return {"output": f"Error: bad arguments for {name}: {exc}", "returncode": 1}
        except Exception as exc:  # a tool's own precondition failure is feedback to the agent
            return {"output": f"Error: {exc}", "returncode": 1}

    def _advance(self):
        notes = []
        while self.current < len(self.instructions) and self._met(self.current):
            self.current += 1
            if self.current < len(self.instructions):
                notes.append(f"\n[STEP {self.current} COMPLETE] Next request: "
                             f"{self.instructions[self.current]}")
            else:
                notes.append("\n[ALL STEPS COMPLETE] Reply <answer>done</answer>.")
        return "".join(notes)

    def _met(self, index):
        try:
            return bool(self.criteria[index](self.state))
        except Exception:
            return False

    def _answer(self, text):
        if self.current >= len(self.instructions) and text.lower() == "done":
            return self._reply("All requests completed.", 1.0, terminated=True)
        pending = self.instructions[min(self.current, len(self.instructions) - 1)]
        return self._reply(f"Not finished yet. Pending request: {pending}", self._progress())

    def _progress(self):
        return self.current / max(1, len(self.instructions))

    def _reply(self, observation, reward, terminated=False, error=None):
        truncated = not terminated and self.turns >= self.max_turns
        info = {"step": self.current, "error": error} if error else {"step": self.current}
        return observation, float(reward), terminated, truncated, info

    def _instruction_text(self, index):
        return f"Request {index + 1} of {len(self.instructions)}: {self.instructions[index]}"


JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
              tuple: "array", set: "array", dict: "object"}
JSON_TYPE_NAMES = {**{kind.__name__: name for kind, name in JSON_TYPES.items()},
                   "List": "array", "Tuple": "array", "Set": "array", "Dict": "object"}
QUOTED_RE = re.compile(r"'([^']*)'|\"([^\"]*)\"")


def tools_from_methods(cls):
    """{name: {"description", "parameters"}} for every `tool_<name>` method of `cls`, in the
    order the class body defines them: the description is the docstring's first paragraph, the
    parameters the signature's (those without a default are required), each typed by its
    annotation (`param_schema`)."""
    tools = {}
    for klass in reversed(cls.__mro__):  # a subclass's method replaces its base's
        for attr, member in vars(klass).items():
            function = getattr(member, "__func__", member)
            if attr.startswith("tool_") and len(attr) > 5 and hasattr(function, "__code__"):
                tools[attr[5:]] = method_tool(attr[5:], function,
                                              bound=not isinstance(member, staticmethod))
    return tools


def method_tool(name, function, bound):
    code = function.__code__
    positional = code.co_varnames[int(bound):code.co_argcount]
    keyword = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    optional = set(positional[len(positional) - len(function.__defaults__ or ()):])
    optional |= set(function.__kwdefaults__ or ())
    annotations = function.__annotations__
    doc = (function.__doc__ or "").strip().split("\n\n")[0]
    return {"description": " ".join(doc.split()) or name.replace("_", " "),
            "parameters": {"type": "object",
                           "properties": {p: param_schema(annotations.get(p))
                                          for p in positional + keyword},
                           "required": [p for p in positional + keyword if p not in optional]}}


def param_schema(annotation):
    """The JSON schema of one annotation: a builtin type (or its typing name) gives its JSON
    type, `Literal[...]` an enum, `Optional[X]` and `X | None` the schema of X; anything else
    (or none) accepts any value."""
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        words = [a or b for a, b in QUOTED_RE.findall(text)]
        if text.startswith(("Literal[", "typing.Literal[")) and words:
            return {"type": "string", "enum": words}
        if text.startswith("Optional[") and text.endswith("]"):
            return param_schema(text[len("Optional["):-1])
        kind = JSON_TYPE_NAMES.get(text.split("[")[0].split("|")[0])
        return {"type": kind} if kind else {}
    origin, args = getattr(annotation, "__origin__", None), getattr(annotation, "__args__", ())
    if repr(origin) == "typing.Literal":
        values = [v for v in args if type(v) in (str, int, float, bool)]
        kinds = {JSON_TYPES[type(v)] for v in values}
        return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}
    if repr(origin) == "typing.Union" or type(annotation).__name__ == "UnionType":
        present = [a for a in args if a is not type(None)]
        return param_schema(present[0]) if len(present) == 1 else {}
    kind = JSON_TYPES.get(origin or annotation) if isinstance(origin or annotation, type) else None
    return {"type": kind} if kind else {}


def finishes(action):
    """Whether `step` ends the episode on `action` once every criterion holds: an answer of
    done, and no tool call (`step` runs a tool call instead of an answer beside it)."""
    if not isinstance(action, str) or TOOL_CALL_RE.search(action):
        return False
    answer = ANSWER_RE.search(action)
    return answer is not None and answer.group(1).lower() == "done"


def internal_names():
    """Names of the base class a subclass must not redefine (besides DESIGNER_NAMES)."""
    implicit = {"__module__", "__doc__", "__qualname__"}
    return frozenset(vars(ToolUseBaseEnv)) - DESIGNER_NAMES - implicit


def criteria_status(env):
    """Each criterion on the env's current state: True/False, or the error text if it raises.

    Reads the instance's own `criteria` and `state` (bypassing any `__getattribute__` or property
    of the env's class), so the reset gate sees what `step` sees.
    """
    own = object.__getattribute__(env, "__dict__")
    criteria, state = own.get("criteria"), own.get("state")
    if not isinstance(criteria, list):
        raise TypeError("setup() must set self.criteria to a list of functions")
    status = []
    for criterion in criteria:
        try:
            status.append(bool(criterion(state)))
        except Exception as exc:  # a criterion that raises is reported, not fatal
            status.append(f"{type(exc).__name__}: {exc}")
    return status
