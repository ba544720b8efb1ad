"""The reference code's tool-use API, for envs written to its templates (github.com/spade-rl/spade).

In: an env module in the reference's format. Its tool-use class subclasses `ToolUseBaseEnv` and
writes `reset(seed)` itself (not `setup`): the tools in `self._tools`, the world in `self._state`,
the answer in `self._expected_answer`, and for a multi-turn task `self._user_messages`,
`self._message_criteria` and `self._current_msg`; `solution()` returns text describing the calls.
Out: what the jail worker needs to play and check such a module: the base class it injects
(`ToolUseBaseEnv`, ours, written to the reference's interface), the names the reference puts in
every env's namespace (`common_names`), how the class is built and whether every episode gets a
fresh instance (`build`, `takes_max_turns`), its solution as actions (`solution_actions`) and its
reset gate (`criteria_status`).
Guarantees: the base class plays as the reference's does: one tool call per action (the first),
an `<answer>` is checked first and ends the episode with 1.0 when `_check_answer` accepts it, a
turn with neither is a format error (-0.1), the last turn reveals the solution. `step` never
raises on malformed agent output. Stdlib only: it runs inside the jail, where the worker loads it
twice (a copy for env code, a private copy for the gate and the solution parse).

`reference_api(tree)` says which API a module targets; `sandbox/contract.py` asks it too.
"""

import json
import re
from _ast import ClassDef, FunctionDef, Name  # the C module: `ast` costs every worker ~0.1 s

MAX_TURNS_CAP = 25  # the most turns an episode gets (sandbox/contract.py MAX_TURNS_CAP)
FORMAT_PENALTY = -0.1
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
ANSWER_LINE_RE = re.compile(r"\bANSWER\s*:\s*(.+?)\s*$", re.I | re.M)
# What the reference injects into every env module so code that forgot an import still loads
# (its synthetic_game_env.py, _COMMON_STDLIB_INJECTIONS, less numpy): module -> names from it.
# Ours adds `Literal`: our tool-use prompt's sketch annotates a choice with it, and a designer
# that copies the annotation drops its import (1 of 12 coder designs: `load` NameError).
# common_names() gives a module only the names its source mentions (statistics and typing cost
# a worker tens of milliseconds to import; most envs use neither).
COMMON_NAMES = {
    "itertools": ("combinations", "permutations", "product", "chain", "accumulate"),
    "math": (), "random": (), "re": (), "json": (), "string": (), "operator": (),
    "statistics": (),
    "collections": ("deque", "defaultdict", "Counter", "OrderedDict", "namedtuple"),
    "functools": ("reduce", "lru_cache"),
    "copy": ("deepcopy",),
    "heapq": ("heappush", "heappop"),
    "typing": ("Tuple", "Dict", "List", "Optional", "Union", "Any", "Set", "FrozenSet",
               "Callable", "Iterable", "Sequence", "Mapping", "Literal"),
}


class ToolUseBaseEnv:
    """The reference's base class: a subclass writes reset, solution and tool_<name> methods."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self._tools = {}
        self._state = {}
        self._call_history = []
        self._expected_answer = None
        self.reset()

    def reset(self, seed=None):
        raise NotImplementedError("a tool-use env in the reference format writes reset()")

    def get_tools(self):
        return [{"type": "function", "function": {
                    "name": name, "description": spec.get("description", ""),
                    "parameters": spec.get("parameters", {"type": "object", "properties": {}})}}
                for name, spec in self._tools.items()]

    def execute_tool(self, name, arguments):
        method = getattr(self, f"tool_{name}", None)
        if method is None:
            return {"output": f"Unknown tool '{name}'", "returncode": 1}
        try:
            output = str(method(**arguments))
        except Exception as exc:  # a failing tool is feedback to the agent, as in the reference
            return {"output": f"Error calling {name}: {exc}", "returncode": 1}
        self._call_history.append({"name": name, "arguments": arguments, "result": output})
        return {"output": output, "returncode": 0}

    def step(self, action):
        self.turn_count += 1
        last_turn = self.turn_count >= self.max_turns
        action = action if isinstance(action, str) else str(action)
        answer = ANSWER_RE.search(action)
        if answer:
            if self._check_answer(answer.group(1).strip()):
                return "Correct!", 1.0, True, False, {}
            if last_turn:
                return f"Wrong answer. Solution:\n{self.solution()}", 0.0, False, True, {}
            return self._incorrect_answer_feedback(), 0.0, False, False, {}
        call = TOOL_CALL_RE.search(action)
        if not call:
            return self._ended_or("Format error: use tools to call a function, or "
                                  "<answer>result</answer> to submit.", FORMAT_PENALTY, last_turn)
        try:
            request = json.loads(call.group(1))
            name, arguments = request.get("name", ""), request.get("arguments", {})
        except (ValueError, AttributeError):
            return self._ended_or("Format error: invalid tool call arguments.", FORMAT_PENALTY,
                                  last_turn)
        arguments = arguments if isinstance(arguments, dict) else {}
        if not isinstance(name, str) or getattr(self, f"tool_{name}", None) is None:
            return self._ended_or(f"Unknown tool '{name}'. Available: "
                                  f"{', '.join(self._tools)}", 0.0, last_turn)
        observation = f"Tool result:\n{self.execute_tool(name, arguments)['output']}"
        if last_turn:
            return f"{observation}\n\nTime up. Solution:\n{self.solution()}", 0.0, False, True, {}
        return observation, 0.0, False, False, {}

    def _ended_or(self, observation, reward, last_turn):
        """The reply to a turn that ran no tool: the feedback, or on the last turn the solution."""
        if last_turn:
            return f"Time up. Solution:\n{self.solution()}", 0.0, False, True, {}
        return observation, reward, False, False, {}

    def _obs_suffix(self):
        return ""  # the reference keeps it for old envs: tools now go through the chat template

    def _incorrect_answer_feedback(self):
        messages = getattr(self, "_user_messages", None)
        current = getattr(self, "_current_msg", None)
        if isinstance(messages, (list, tuple)) and isinstance(current, int) \
                and 0 <= current < len(messages):
            return (f"Incorrect. Keep using tools. Not all steps are complete: you are still on "
                    f"step {current + 1}/{len(messages)}: \"{messages[current]}\" Complete it "
                    "with the tools before submitting <answer>done</answer>.")
        return "Incorrect. Keep using tools."

    def _check_answer(self, answer):
        """Case-insensitive match, or numbers within 0.01 ($ and thousands commas ignored)."""
        given, expected = str(answer).strip(), str(self._expected_answer).strip()
        if given.lower() == expected.lower():
            return True
        try:
            return abs(float(given.replace("$", "").replace(",", "")) -
                       float(expected.replace("$", "").replace(",", ""))) < 0.01
        except ValueError:
            return False

    def close(self):
        pass


def reference_api(tree):
    """True when the module's `*Env` class subclasses ToolUseBaseEnv and writes `reset` itself
    rather than `setup` (our API): it targets the reference's base class. (A module has exactly
    one such class, sandbox/env_class.py; with several, the first is read here and the static
    checks and the worker reject the module.)"""
    for node in tree.body:
        if isinstance(node, ClassDef) and node.name.endswith("Env") \
                and node.name != "ToolUseBaseEnv":
            if not any(isinstance(base, Name) and base.id == "ToolUseBaseEnv"
                       for base in node.bases):
                return False
            methods = {item.name for item in node.body if isinstance(item, FunctionDef)}
            return "reset" in methods and "setup" not in methods
    return False


def common_names(source):
    """{name: object} for each name in COMMON_NAMES that `source` mentions as a word."""
    words = set(re.findall(r"\w+", source))
    names = {}
    for module_name, members in COMMON_NAMES.items():
        wanted = words.intersection((module_name, *members))
        if wanted:
            module = __import__(module_name)
            names.update({name: module if name == module_name else getattr(module, name)
                          for name in wanted})
    return names


def takes_max_turns(cls):
    """Whether the class's constructor takes `max_turns`, as the reference's templates write it
    (`__init__(self, max_turns=10, **kwargs)`, its tool-use base class's too). The reference
    builds such a class afresh for every episode it plays; so does the worker."""
    code = getattr(getattr(cls, "__init__", None), "__code__", None)
    return code is not None and "max_turns" in \
        code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


def build(cls):
    """An instance of the env class. A class whose constructor takes `max_turns` gets its own
    default capped at MAX_TURNS_CAP, as the reference's rollouts build it (the game's pacing
    within the budget); any other, no argument."""
    if not takes_max_turns(cls):
        return cls()
    init = cls.__init__
    default = _default_of(init, init.__code__, "max_turns")
    if isinstance(default, bool) or not isinstance(default, int) or default < 1:
        default = MAX_TURNS_CAP
    return cls(max_turns=min(default, MAX_TURNS_CAP))


def _default_of(function, code, name):
    keyword_defaults = getattr(function, "__kwdefaults__", None) or {}
    if name in keyword_defaults:
        return keyword_defaults[name]
    positional = code.co_varnames[:code.co_argcount]
    defaults = getattr(function, "__defaults__", None) or ()
    index = positional.index(name) - (len(positional) - len(defaults)) if name in positional else -1
    return defaults[index] if 0 <= index < len(defaults) else None


# -- the worker's private copy: solution and reset gate ----------------------------------------

def solution_actions(env):
    """solution() as the actions that replay it: a list of strings as it is; the reference's text
    ("1. cd(path='docs') 2. mkdir(name='archive') ... ANSWER: archive/report.txt") as one
    `<tool_call>` per call it names (JSON `<tool_call>` blocks and `tool(arg=value)` notation for
    the env's own tools, in the order written), then `<answer>` with `_expected_answer` (or, when
    that is unset, the answer the text gives)."""
    solution = env.solution()
    if isinstance(solution, list):
        return solution
    text = str(solution)
    own = object.__getattribute__(env, "__dict__")
    tools = own.get("_tools") if isinstance(own.get("_tools"), dict) else {}
    calls = sorted(_json_calls(text) + _notation_calls(text, tools))
    expected = own.get("_expected_answer")
    answer = expected if expected is not None else _answer_in(text)
    finish = [] if answer is None else [f"<answer>{answer}</answer>"]
    return [f"<tool_call>{json.dumps(call)}</tool_call>" for _, call in calls] + finish


def _json_calls(text):
    calls = []
    for match in TOOL_CALL_RE.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            calls.append((match.start(), {"name": call["name"],
                                          "arguments": call.get("arguments", {})}))
    return calls


def _notation_calls(text, tools):
    """`name(a=1, b='x')` (or `tool_name(...)`, or positional arguments in the schema's order)
    for each tool the env defines, outside `<tool_call>` blocks."""
    if not tools:
        return []
    blocks = [match.span() for match in TOOL_CALL_RE.finditer(text)]
    names = "|".join(sorted(map(re.escape, tools), key=len, reverse=True))
    calls = []
    for match in re.finditer(rf"(?<![\w.])(?:tool_)?({names})\s*\(", text):
        if any(start <= match.start() < end for start, end in blocks):
            continue
        close = _closing_paren(text, match.end() - 1)
        if close is None:
            continue
        arguments = _arguments(text[match.end() - 1:close + 1], tools[match.group(1)])
        if arguments is not None:
            calls.append((match.start(), {"name": match.group(1), "arguments": arguments}))
    return calls


def _closing_paren(text, start):
    depth, quote = 0, None
    for index in range(start, len(text)):
        char = text[index]
        if quote:
            if char == quote and text[index - 1] != "\\":
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return index
    return None


def _arguments(parenthesised, spec):
    """{name: value} of a call's argument list, values as literals (a bare word as its text)."""
    import ast  # only here: most workers never read a solution's text

    try:
        call = ast.parse("f" + parenthesised, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    properties = spec.get("parameters", {}).get("properties", {}) if isinstance(spec, dict) else {}
    positional = list(properties) if isinstance(properties, dict) else []
    if len(call.args) > len(positional):
        return None
    pairs = list(zip(positional, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
    return {name: _value(ast, node) for name, node in pairs}


def _value(ast, node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return node.id if isinstance(node, Name) else ast.unparse(node)


def _answer_in(text):
    found = ANSWER_RE.findall(text) or ANSWER_LINE_RE.findall(text)
    return found[-1].strip() if found else None


def criteria_status(env):
    """Each `_message_criteria` on `_state` right now: True/False, or the error text if it raises;
    [] for a single-task env (no criteria: nothing to gate). Reads the instance's own attributes,
    bypassing any `__getattribute__` or property of the env's class."""
    own = object.__getattribute__(env, "__dict__")
    criteria, state = own.get("_message_criteria"), own.get("_state")
    if criteria is None:
        return []
    if not isinstance(criteria, (list, tuple)):
        raise TypeError("reset() must set self._message_criteria to a list of functions")
    status = []
    for criterion in criteria:
        try:
            status.append(bool(criterion(state)))
        except Exception as exc:  # a criterion that raises is reported, not fatal
            status.append(f"{type(exc).__name__}: {exc}")
    return status
