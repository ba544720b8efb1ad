"""The environment contract as named checks, run in a fixed order.

In: a model's answer (text) or an env program's source, and the validation seeds (drawn fresh
by the caller for every validation, so an env cannot recognise them), with spare seeds to draw
when every seed gives the same episode (`Seeds`). Out: the first failing check as
`ContractError(check, msg, outcome)`, or the facts `rollout` needs (`EnvFacts`); `Seeds.used`
then lists every seed the checks played.
Guarantees: static checks never execute the code; every runtime check talks to the env only
through jailed `Worker`s; `solution()` runs in a worker of its own, never in the one whose plays
check it (rollouts never call it, so nothing it does may help a play); a timeout, memory or
output outcome anywhere is reported by the `resources` check, whatever check was running, and
an attempt at what the jail refuses (a signal to another process, a new process, a socket other
than AF_UNIX, ctypes) or at reaching into the worker (gc's object lists, trace functions:
sandbox/worker.py `refusal_hook`) by the `policy` check, naming it, whether or not the attempt
could have done anything, and a class the worker finds is not what its class statement built
(sandbox/env_class.py `Guard`) by the `structure` check. `structure` reads the same rules
statically: one env class, plain class statements of the module all the way to
ToolUseBaseEnv or object, none of the hooks that let the class played differ from the class
checked (sandbox/env_class.py `shape_problem`).

Order: extract, parse, structure, load, reset, determinism, garbage, step_types, oracle, trivial,
resources, reset_gate (tool use only). `step_types` is checked on every step any check takes.
The contract as users read it, with every check and how to fix a reject: docs/environments.md.

Envs written to the reference code's templates (github.com/spade-rl/spade; `EnvClass.reference`)
pass the same checks. The jail plays them as the reference does (sandbox/reference_tool_base.py:
its tool-use base class, the names it injects, the class built with `max_turns`, a solution told
in text read as actions; sandbox/math_verify_shim.py), and here their rewards may reach
+-REFERENCE_REWARD_BOUND, the reference's own range (rollouts clip the episode reward, the only
one that counts, to [-1, 1]). For every env, a `solution()` that returns the bare answer is
boxed, and a game in the reference's format (its `__init__` takes `max_turns`) without
`solution()` (the reference's multi-turn template has none) passes every check but `oracle`,
which cannot run: `EnvFacts.oracle` is False, and its record says `oracle: none`. A game in our
format must define `solution()`: without it no check could tell a winnable game from one no
agent can win (the coder wrote such a game, and it was accepted before this rule). docs/environments.md, "Envs in the reference format", has it all as users read it.

Every check plays `solution()`'s actions as a model's reply reaches the env in `spade rollout`
(sandbox/actions.py: a game's last balanced box), and an action holding a character no reply
carries (a form feed from an ordinary "\\frac" literal) fails `oracle` (`sent_actions`). A
tool-use module's own `class ToolUseBaseEnv` that only restates the base is blanked before the
checks (`drop_restated_base`); one whose env class is that class itself is renamed to subclass
it (`name_env_after_base`); and a `"\\boxed"` in an ordinary literal, a backspace nobody
means, is mended to the backslash it was meant to be (`repair_boxed_escapes`);
stages/validate.py marks a design cut at --max-tokens whose code does not parse `truncated`.

The reset gate is ours, stricter than the reference's, for both APIs: a criterion that holds at
reset, or raises, on any seed fails it (the reference rejects only a criterion that raises at every
seed it tries, and skips the gate at rollout 0). Kept because on every valid tool-use env we have,
native and reference-format (tests/fixtures/validate/valid, reference; the seed library; the
docs' example), it rejects none, and the reference's own template calls a step that holds at reset
broken ("FALSE AT RESET / NOT FREE").
"""

from __future__ import annotations

import ast
import io
import re
import sys
import threading
import tokenize
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from sandbox.actions import as_sent, unsendable_reason
from sandbox import env_class, reference_tool_base, tool_base
from sandbox.budget import ENV_BUDGET, EnvBudget
from sandbox.jail import Reply, Sandbox, SandboxUnavailable, Worker

CHECKS = ("extract", "parse", "truncated", "structure", "load", "reset", "determinism", "garbage",
          "step_types", "oracle", "trivial", "resources", "reset_gate", "policy")
# Any stdlib module may be imported: the jail, not this list, is the security boundary. These
# are refused only because they cannot work in the jail or make no sense in an env.
NO_NETWORK = "the jail has no network"
DENIED_IMPORTS = {
    "subprocess": "an env is one process: the jail has no programs to run",
    "multiprocessing": "an env is one process: the jail allows only a handful",
    "socket": NO_NETWORK, "ssl": NO_NETWORK, "http.client": NO_NETWORK,
    "http.server": NO_NETWORK, "urllib.request": NO_NETWORK, "ftplib": NO_NETWORK,
    "smtplib": NO_NETWORK, "xmlrpc": NO_NETWORK, "webbrowser": NO_NETWORK,
    "ctypes": "native code: nothing a text env does needs it",
    "tkinter": "the jail has no display", "turtle": "the jail has no display",
    "curses": "the jail has no terminal",
}
# Third-party names the jail offers anyway, as stand-ins: module -> the names it has.
PROVIDED_IMPORTS = {"math_verify": ("parse", "verify")}  # sandbox/math_verify_shim.py
MAX_TURNS_CAP = reference_tool_base.MAX_TURNS_CAP
# what a designer that wrote its own call() or finish() is told (the 1.5B coder did, 4 of 24)
SOLUTION_HELPERS = dict.fromkeys(
    ("call", "finish"), ": the base class's call(tool, **arguments) and finish() already build "
    "the actions solution() returns; use them as self.call(...) and self.finish()")
REWARD_BOUND = 1.0
REFERENCE_REWARD_BOUND = 10.0  # the range the reference's own validation allows
VALIDATION_SEEDS = 5  # how many seeds the caller draws; every runtime check uses some of them
# Spare seeds, drawn one at a time only while every seed gives the same episode: a valid game
# with k answers and one observation shows the same episode on 5 fresh seeds with probability
# k**-4 (6% for 2 answers, 1.2% for 3), on 25 with k**-24.
SPARE_SEEDS = 20
PROBE_ACTION = "\\boxed{zzz}"  # ends the determinism replay: one step past the solution
GARBAGE_ACTIONS = ("", "hello", "\\boxed{}", "\\boxed{zzz}", "\\boxed{-1}", "\\boxed{1 2 3}",
                   "\\boxed{\\boxed{}}", "Ω≈ç√ 🂡", "x" * 5000, "<tool_call>{bad json</tool_call>",
                   '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                   "<answer>done</answer>", "\\boxed{" + "9" * 400 + "}")
# What a player who knows nothing of this episode would try; cycled for max_turns.
GENERIC_ACTIONS = ("\\boxed{}", "\\boxed{0}", "\\boxed{1}", "\\boxed{yes}", "\\boxed{no}",
                   "\\boxed{a}", "\\boxed{north}", "\\boxed{east}", "\\boxed{south}",
                   "\\boxed{west}", "\\boxed{up}", "\\boxed{down}", "\\boxed{left}",
                   "\\boxed{right}", "\\boxed{help}",
                   '<tool_call>{"name": "help", "arguments": {}}</tool_call>',
                   "<answer>done</answer>")
IDLE_ACTION = {"game": "\\boxed{}", "tool_use": "<answer>done</answer>"}
IDLE_SEEDS = 3  # doing nothing is played on the first seeds only: it never wins by luck
FENCE_RE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
# The longest env source accepted (UTF-8 bytes): the seed library's largest env is about 9 KiB;
# a 50 MB one cost `spade hint` 10 GB and two minutes.
MAX_SOURCE_BYTES = 256 << 10


class ContractError(Exception):
    """A failed check. `raised` names the env's own exception when that is the failure,
    whichever check's call met it: {"op": "step", "type": "NameError"}."""

    def __init__(self, check: str, msg: str, outcome: str = "ok",
                 raised: dict[str, str] | None = None):
        super().__init__(f"{check}: {msg}")
        self.check, self.msg, self.outcome, self.raised = check, msg, outcome, raised


@dataclass
class Seeds:
    """One validation's seeds, all distinct: `used`, which the runtime checks play, and `spare`,
    moved onto `used` in order, one at a time, only while every used seed has the same
    solution, so a game with few answers is not rejected because its fresh seeds agreed."""

    used: list[int]
    spare: list[int] = field(default_factory=list)

    def draw(self) -> int | None:
        """The next spare seed, now used; None when none is left."""
        if not self.spare:
            return None
        self.used.append(self.spare.pop(0))
        return self.used[-1]


@dataclass
class EnvFacts:
    class_name: str
    domain: str
    max_turns: int
    tools: list[dict[str, Any]] = field(default_factory=list)
    oracle: bool = True  # False: the env has no solution(), so no oracle checked it


# -- static checks: they never run the code ------------------------------------------------------

def extract(text: str) -> str:
    """The ```python block of a model's answer (the longest, when there are several), at most
    MAX_SOURCE_BYTES long."""
    blocks = [b for b in FENCE_RE.findall(text) if b.strip()]
    if not blocks:
        raise ContractError("extract", "no ```python code block in the answer")
    return check_size(max(blocks, key=len).strip("\n") + "\n")


def check_size(source: str) -> str:
    """`source`, unless it is longer than MAX_SOURCE_BYTES (an `extract` reject)."""
    size = len(source) if len(source) > MAX_SOURCE_BYTES else len(
        source.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        raise ContractError("extract", f"the env's source is {size} bytes, more than the "
                            f"{MAX_SOURCE_BYTES} ({MAX_SOURCE_BYTES >> 10} KiB) an env may have")
    return source


_AST_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """The source's AST. A syntax error, a null byte, or nesting too deep for Python's parser
    (MemoryError or RecursionError in ast.parse, e.g. 100k nested unary minus) is a `parse`
    reject: the interpreter in the jail could not compile it either."""
    # CPython 3.11's AST constructor keeps a recursion counter that concurrent ast.parse calls
    # corrupt ("AST constructor recursion depth mismatch"); validate runs checks in threads.
    try:
        with _AST_LOCK:
            return ast.parse(source)
    except SyntaxError as exc:  # a null byte too on Python 3.11.7 (lineno None: no "line")
        where = f"line {exc.lineno}: " if exc.lineno is not None else ""
        raise ContractError("parse", f"{where}{exc.msg}") from None
    except ValueError as exc:  # null bytes
        raise ContractError("parse", str(exc)) from None
    except (MemoryError, RecursionError) as exc:
        raise ContractError("parse", f"the source nests too deeply for Python's parser "
                            f"({type(exc).__name__}{': ' + str(exc) if str(exc) else ''}); "
                            "write long expressions as loops or data") from None


def import_problem(name: str) -> str | None:
    """Why an env may not import `name`, or None: the stdlib minus DENIED_IMPORTS, and
    PROVIDED_IMPORTS."""
    top, _, member = name.partition(".")
    if name == ".":
        return "relative imports are not allowed (an env is one module)"
    if top in PROVIDED_IMPORTS:
        offered = PROVIDED_IMPORTS[top]
        if member and member not in offered:
            return f"the jail's {top} is a stand-in that has only {' and '.join(offered)}"
        return None
    if top not in sys.stdlib_module_names:
        return ("not in the standard library: the jail has no third-party packages (an env may "
                "import the stdlib, and parse and verify from math_verify)")
    for denied, reason in DENIED_IMPORTS.items():
        if name == denied or name.startswith(denied + "."):
            return reason
    return None


def check_imports(tree: ast.Module) -> None:
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # `from urllib import request` is urllib.request
            names = ([f"{node.module}.{alias.name}" for alias in node.names]
                     if node.level == 0 and node.module else ["."])
        for name in names:
            problem = import_problem(name)
            if problem:
                raise ContractError("structure", f"line {node.lineno}: import of '{name}' is not "
                                    f"allowed: {problem}")


@dataclass(frozen=True)
class EnvClass:
    """What the source says of its env class, without running it."""

    name: str
    reference: bool  # written to the reference code's templates (see the module docstring)
    solution: bool  # defines solution(), so the oracle can run


def structure(tree: ast.Module) -> EnvClass:
    """Check imports and the env class: exactly one (sandbox/env_class.py `env_class`, the rule
    the worker plays by), plain classes that cannot make the class played differ from the class
    checked (`env_class.shape_problem`: the rules the worker also holds the loaded classes to),
    the methods its API needs, no import-time code that changes a class or rebinds the env
    class's name (`import_time_patch`), and for our tool-use API no redefined base-class
    internals, in the env class or any module class it inherits from (the reference's API
    forbids none: it has no criteria to guard, and every check but the reset gate plays the env
    as a black box)."""
    check_imports(tree)
    try:
        node = env_class.env_class(tree)
    except env_class.EnvClassError as exc:
        raise ContractError("structure", str(exc)) from None
    shape = env_class.shape_problem(tree, node)
    if shape:
        raise ContractError("structure", shape)
    classes = env_class.ancestry(tree, node)
    names: dict[str, int] = {}
    for cls in reversed(classes):  # what the env class itself binds wins, as in its MRO
        if cls is not node and cls.name == env_class.BASE_NAME:
            continue  # a restated base: drop_restated_base removes it, or rejects what differs
        names.update(env_class.class_bindings(cls))
    tool_use = env_class.inherits_base(classes)
    reference_api = reference_tool_base.reference_api(tree)
    reference_game = not tool_use and takes_max_turns(node)
    needed = ({"reset", "solution"} if reference_api else {"setup", "solution"}
              if tool_use else {"reset", "step"} | ({"solution"} if not reference_game else set()))
    missing = needed - names.keys()
    if missing:
        # a game without solution() would skip the oracle: only the reference's template may
        why = (": a game defines solution(), the actions that win, so the oracle can check it "
               "is winnable" if missing == {"solution"} and not tool_use else "")
        raise ContractError("structure", f"class {node.name} lacks "
                            f"{', '.join(sorted(missing))}{why}")
    own_api = tool_use and not reference_api
    overrides = sorted(tool_base.internal_names() & names.keys()) if own_api else []
    if overrides:
        owner = next(cls.name for cls in classes
                     if overrides[0] in env_class.class_bindings(cls))
        raise ContractError("structure", f"line {names[overrides[0]]}: class {owner} "
                            f"redefines ToolUseBaseEnv.{overrides[0]}; a tool-use env "
                            "defines setup, solution, max_turns, tool_<name> methods and "
                            "its own helpers, never the base class's internals"
                            + SOLUTION_HELPERS.get(overrides[0], ""))
    patch = env_class.import_time_patch(tree, node.name)
    if patch:
        raise ContractError("structure", f"{patch}: an env's classes are what their class "
                            "statements define; put every method in the class body")
    reference = reference_api or takes_max_turns(node)
    return EnvClass(node.name, reference, "solution" in names)


def takes_max_turns(cls: ast.ClassDef) -> bool:
    """Whether the class's own __init__ takes `max_turns`, as the reference's templates write
    it (`def __init__(self, max_turns=10, **kwargs)`): reference_tool_base.takes_max_turns, read
    from the source."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            arguments = node.args.args + node.args.kwonlyargs
            return any(argument.arg == "max_turns" for argument in arguments)
    return False


def static_checks(text: str, is_source: bool = False) -> str:
    """extract, parse, structure; returns the source."""
    source = check_size(text) if is_source else extract(text)
    try:
        structure(parse(source))
    except RecursionError:  # a tree ast.parse built but too deep to walk
        raise ContractError("parse", "the source nests too deeply to check "
                            "(RecursionError); write long expressions as loops or data") from None
    return source


def _stub(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A method body that does nothing: a docstring, `pass`, `...`, `return`/`return None`,
    `raise NotImplementedError(...)`."""
    for statement in function.body:
        if isinstance(statement, ast.Pass):
            continue
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring or `...`
        if isinstance(statement, ast.Return) and (statement.value is None or (
                isinstance(statement.value, ast.Constant) and statement.value.value is None)):
            continue
        if isinstance(statement, ast.Raise) and statement.exc is not None:
            exc = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                continue
        return False
    return True


TASK_ENV_NAME = "ToolUseTaskEnv"  # what an env named after the base class is called instead
_BASE_HEADER = re.compile(rf"\bclass\s+{env_class.BASE_NAME}\s*(?:\(\s*\))?\s*:")


def name_env_after_base(source: str) -> tuple[str, str | None]:
    """A tool-use module whose one env class is `class ToolUseBaseEnv:` itself, holding the
    env (its setup, tools, criteria and solution: 18 of the coder's 43 tool-use designs here),
    named its env after the base class the prompt shows. Its header becomes
    `class ToolUseTaskEnv(ToolUseBaseEnv):` on the same line, so the env subclasses the
    injected base and every check then judges it as written (a `reset` or `step` of its own
    is still a `structure` reject). Returns the source and the new name; a module with another
    `*Env` class, a base of its own, or that does not parse comes back as it is, with None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, None
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    own = [node for node in classes if node.name == env_class.BASE_NAME]
    if len(own) != 1 or own[0].bases or own[0].keywords or TASK_ENV_NAME in source \
            or any(node.name.endswith("Env") and node is not own[0] for node in classes):
        return source, None
    lines = source.splitlines(keepends=True)
    header = lines[own[0].lineno - 1]
    renamed = _BASE_HEADER.sub(f"class {TASK_ENV_NAME}({env_class.BASE_NAME}):", header, 1)
    if renamed == header:  # a header split over lines: leave it to the structure check
        return source, None
    lines[own[0].lineno - 1] = renamed
    return "".join(lines), TASK_ENV_NAME


def drop_restated_base(source: str) -> tuple[str, bool]:
    """A tool-use module that writes its own `class ToolUseBaseEnv` (the designer prompt says it
    is injected; small models write it anyway): when that class only restates the base (methods
    and attributes the base has, every method a stub, constant class attributes), its lines are
    blanked, so line numbers hold, and True is returned; one that changes behaviour is a
    `structure` reject saying what to remove. A module without one comes back as it is."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, False
    own = [node for node in tree.body
           if isinstance(node, ast.ClassDef) and node.name == env_class.BASE_NAME]
    if not own:
        return source, False
    if len(own) > 1:
        raise ContractError("structure", f"{env_class.BASE_NAME} is defined {len(own)} times; the "
                            "jail provides it: remove every definition")
    node = own[0]
    base_names = set(vars(tool_base.ToolUseBaseEnv))

    def reject(why: str) -> ContractError:
        return ContractError("structure", f"line {node.lineno}: the module defines its own "
                             f"{env_class.BASE_NAME}, and {why}; the jail provides the base "
                             "class: remove the class and keep only your *Env subclass")

    if node.bases or node.keywords or node.decorator_list:
        raise reject("it has bases, keywords or decorators of its own")
    for item in node.body:
        if isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant):
            continue
        if isinstance(item, ast.Pass):
            continue
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if item.name not in base_names:
                raise reject(f"its {item.name}() is not a method of the injected one")
            if item.decorator_list or not _stub(item):
                raise reject(f"its {item.name}() has a body of its own (line {item.lineno})")
            continue
        if isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if len(names) == len(targets) and set(names) <= base_names | {"max_turns"} \
                    and (item.value is None or isinstance(item.value, ast.Constant)):
                continue
            raise reject(f"it sets an attribute the injected one does not (line {item.lineno})")
        raise reject(f"its body runs code (line {item.lineno})")
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = source.splitlines(keepends=True)
    for index in range(first - 1, node.end_lineno):
        lines[index] = "\n"
    lines[first - 1] = "# (ToolUseBaseEnv restated here: dropped, the jail provides it)\n"
    return "".join(lines), True


# `\boxed` after an odd run of backslashes: in an ordinary literal, an escape `\b` (a backspace)
BOXED_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\boxed")


def repair_boxed_escapes(source: str) -> tuple[str, int]:
    """`"\boxed{open 3}"` in an ordinary (not raw) string literal is a backspace and `oxed{...}`:
    nobody means that, and no agent can send it, yet small coders write it often (1 of the
    coder's first 5 designs here). Each such `\boxed` becomes `\\boxed`, the backslash it was
    meant to be; returns the source and how many were mended. Raw literals, and a `\\boxed`
    already escaped, stay as they are; other escapes (`"\frac"`, a form feed) are left to the
    oracle, which names them. Only Python 3.11's STRING tokens are read: on 3.12 and later an
    f-string is left to the oracle too. Source that does not tokenize comes back as it is."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return source, 0
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    pieces, at, mended = [], 0, 0
    for token in tokens:
        if token.type != tokenize.STRING:
            continue
        prefix = token.string[:len(token.string) - len(token.string.lstrip("rRbBuUfF"))]
        if "r" in prefix.lower():
            continue
        fixed, count = BOXED_ESCAPE.subn(r"\1\\\\boxed", token.string)
        if count:
            begin = starts[token.start[0] - 1] + token.start[1]
            end = starts[token.end[0] - 1] + token.end[1]
            pieces += [source[at:begin], fixed]
            at, mended = end, mended + count
    return "".join(pieces) + source[at:], mended


# -- runtime checks: through jailed workers ------------------------------------------------------

class Probe:
    """Calls into a worker, turning any non-ok reply into the running check's failure; but a
    timeout, memory or output outcome is `resources`', an attempt the jail refuses `policy`'s
    and a class the worker finds is not its class statement's (EnvClassError) `structure`'s,
    whatever check was running. Given an `EnvBudget`, every call spends it (running out is a
    `resources` failure)."""

    def __init__(self, worker: Worker, reward_bound: float = REWARD_BOUND,
                 budget: EnvBudget | None = None):
        self.worker = worker
        self.check = "load"
        self.reward_bound = reward_bound
        self.budget = budget

    def call(self, op: str, **fields: Any) -> Reply:
        reply = (self.worker.call(op, **fields) if self.budget is None
                 else self.budget.call(self.worker, op, **fields))
        if reply.outcome == "sandbox_failure":
            raise SandboxUnavailable((reply.error or {}).get("msg", "sandbox failure"))
        if reply.outcome in ("timeout", "oom", "output_limit", ENV_BUDGET):
            raise ContractError("resources", f"{reply.outcome} during {self.check} "
                                f"({op}): {(reply.error or {}).get('msg', '')}", reply.outcome)
        if not reply.ok and (reply.error or {}).get("type") == "RefusedOperation":
            raise ContractError("policy", f"during {self.check} ({op}), the env tried "
                                f"{reply.error.get('msg', '')}", reply.outcome)
        if not reply.ok and (reply.error or {}).get("type") == "EnvClassError":
            raise ContractError("structure", f"during {self.check} ({op}): "
                                f"{reply.error.get('msg', '')}", reply.outcome)
        if not reply.ok and (reply.error or {}).get("type") == "bad_reply":  # sandbox/replies.py
            raise ContractError("step_types" if op == "step" else self.check, reply.error["msg"],
                                reply.outcome)
        if not reply.ok:
            error = reply.error or {}
            raise ContractError(self.check, f"{op} raised {error.get('type')}: "
                                f"{error.get('msg', '')}".strip(), reply.outcome,
                                raised={"op": op, "type": str(error.get("type"))})
        return reply

    def reset(self, seed: int) -> list:
        reply = self.call("reset", seed=seed)
        if reply.shape != ["tuple", 2]:  # its types, (str, dict), are checked for every reply
            raise ContractError(self.check, f"reset(seed={seed}) must return (str, dict), got "
                                f"{describe(reply)}")
        if not reply.result[0].strip():
            raise ContractError(self.check, f"reset(seed={seed}) returned an empty observation")
        return reply.result

    def step(self, action: str) -> list:
        reply = self.call("step", action=action)
        problem = step_problem(reply, self.reward_bound)
        if problem:
            raise ContractError("step_types", f"step({short(action)}) {problem}")
        return reply.result


def describe(reply: Reply) -> str:
    kind, size = (reply.shape or ["?", None])
    return f"{kind} of length {size}" if size is not None else kind


def short(action: str) -> str:
    return repr(action if len(action) <= 40 else action[:37] + "...")


def step_problem(reply: Reply, reward_bound: float = REWARD_BOUND) -> str | None:
    """What the contract asks of a step beyond the types every reply has (sandbox/replies.py):
    a tuple, and a reward within the bound."""
    if reply.shape != ["tuple", 5]:
        return f"must return a 5-tuple (obs, reward, terminated, truncated, info), got {describe(reply)}"
    reward = reply.result[1]
    if not -reward_bound <= reward <= reward_bound:
        return f"reward {reward} is outside [-{reward_bound:g}, {reward_bound:g}]"
    return None


def load(probe: Probe, source: str) -> EnvFacts:
    probe.check = "load"
    facts = probe.call("load", source=source).result
    max_turns = facts.get("max_turns")
    if max_turns is None:
        max_turns = MAX_TURNS_CAP
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ContractError("load", f"max_turns must be a positive int, got {max_turns!r}")
    return EnvFacts(facts["class_name"], facts["domain"], min(max_turns, MAX_TURNS_CAP))


@dataclass
class Solved:
    """What the solution worker saw for one seed: the first observation and solution() (None
    for an env without one)."""

    first: list
    actions: list[str] | None


ACTION_MARKS = ("\\boxed{", "<tool_call>", "<answer>")


def solution_actions(probe: Probe, seed: int) -> list[str]:
    """solution() as actions: a list as it is; text with actions in it, one action a line; a bare
    answer (text without an action in it, or a number: the reference's `solution() -> str`)
    boxed, as the agent would answer it."""
    reply = probe.call("solution")
    actions = reply.result
    if isinstance(actions, (int, float)) and not isinstance(actions, bool):
        actions = str(actions)
    if isinstance(actions, str) and actions.strip() \
            and not any(mark in actions for mark in ACTION_MARKS):
        actions = [f"\\boxed{{{actions.strip()}}}"]
    elif isinstance(actions, str):
        actions = [line for line in actions.splitlines() if line.strip()] or [actions]
    if not isinstance(actions, list) or not actions or not all(isinstance(a, str) for a in actions):
        raise ContractError("oracle", f"solution() for seed {seed} must return a non-empty list "
                            f"of action strings, got {describe(reply)}")
    return actions


def sent_actions(actions: list[str], domain: str, seed: int) -> list[str]:
    """solution()'s actions as a model's reply reaches the env in `spade rollout` (a game's last
    balanced box, sandbox/actions.py), so every check plays only what an agent can send; an
    action holding a character no reply carries (a backspace from an ordinary "\\boxed"
    literal) fails the oracle."""
    for index, action in enumerate(actions):
        reason = unsendable_reason(action, index, seed)
        if reason:
            raise ContractError("oracle", reason)
    return [as_sent(action, domain) for action in actions]


def finished(actions: list[str]) -> list[str]:
    """A solution of our tool-use API as the checks replay it: ending with `finish()` when its
    last action does not (sandbox/tool_base.py: ending is the base class's protocol)."""
    return actions if tool_base.finishes(actions[-1]) else [*actions, tool_base.FINISH]


def solve(sandbox: Sandbox, source: str, seeds: Seeds, env: EnvClass) -> dict[int, Solved]:
    """solution() for each used seed, each right after a fresh reset, in a worker of its own
    (for an env without solution(), the first observations only); then, while every seed gives
    the same episode, for spare seeds drawn one at a time (an env without solution() draws
    none: its seeds' hidden states cannot be told apart)."""
    with Worker(sandbox) as worker:
        probe = Probe(worker)
        domain = load(probe, source).domain
        solved: dict[int, Solved] = {}

        def solve_one(seed: int) -> None:
            probe.check = "reset"
            first = probe.reset(seed)
            probe.check = "oracle"
            actions = sent_actions(solution_actions(probe, seed), domain, seed) \
                if env.solution else None
            if actions and domain == "tool_use" and not env.reference:
                actions = finished(actions)
            solved[seed] = Solved(first, actions)

        for seed in list(seeds.used):
            solve_one(seed)
        while env.solution and same_solution(solved) and (seed := seeds.draw()) is not None:
            solve_one(seed)
        return solved


def same_episode(solved: dict[int, Solved]) -> bool:
    """Every seed gave the same first observation and solution."""
    episodes = list(solved.values())
    return all(episode == episodes[0] for episode in episodes)


def same_solution(solved: dict[int, Solved]) -> bool:
    """Every seed's solution is the same action list (whatever its observations say)."""
    solutions = [episode.actions for episode in solved.values()]
    return all(actions == solutions[0] for actions in solutions)


def check_reset(probe: Probe, seeds: Sequence[int]) -> None:
    probe.check = "reset"
    for seed in seeds:
        probe.reset(seed)


def trace(probe: Probe, seed: int, actions: list[str]) -> list:
    steps: list = [probe.reset(seed)]
    for action in actions:
        steps.append(probe.step(action))
        if steps[-1][2] or steps[-1][3]:
            break
    return steps


def check_determinism(probe: Probe, seed: int, solved: Solved, facts: EnvFacts,
                      global_random: str | None = None) -> None:
    """The whole solution (for an env without one, the generic actions for max_turns), replayed
    twice from the same seed, gives the same episode, which starts as it did in the solution
    worker. `global_random` (global_random_use) is added to a failure's message."""
    probe.check = "determinism"
    why = f": {global_random}" if global_random else ""
    actions = (generic_actions(facts.max_turns) if solved.actions is None
               else solved.actions) + [PROBE_ACTION]
    first, second = trace(probe, seed, actions), trace(probe, seed, actions)
    if first[0] != solved.first:
        raise ContractError("determinism", f"reset(seed={seed}) gave different results in two "
                            f"workers{why}")
    for index, (a, b) in enumerate(zip(first, second)):
        if a != b:
            where = f"reset(seed={seed})" if index == 0 else f"step {index}"
            raise ContractError("determinism", f"same seed and actions gave different results "
                                f"at {where}{why}")


def check_garbage(probe: Probe, seed: int) -> None:
    probe.check = "garbage"
    probe.reset(seed)
    for action in GARBAGE_ACTIONS:
        reply = probe.call("step", action=action)
        problem = step_problem(reply, probe.reward_bound)
        if problem:
            raise ContractError("step_types", f"step({short(action)}) {problem}")
        if reply.result[2] or reply.result[3]:
            probe.reset(seed)


def play(probe: Probe, seed: int, policy: Callable[[int], str], max_turns: int) -> tuple[bool, float]:
    """Run one episode; returns (terminated, last reward)."""
    probe.reset(seed)
    reward = 0.0
    for turn in range(max_turns):
        obs, reward, terminated, truncated, info = probe.step(policy(turn))
        if terminated:
            return True, float(reward)
        if truncated:
            break
    return False, float(reward)


def won(outcome: tuple[bool, float]) -> bool:
    return outcome[0] and outcome[1] > 0


def replay(actions: list[str]) -> Callable[[int], str]:
    return lambda turn: actions[turn]


def generic_action(turn: int) -> str:
    return GENERIC_ACTIONS[turn % len(GENERIC_ACTIONS)]


def generic_actions(max_turns: int) -> list[str]:
    return [generic_action(turn) for turn in range(max_turns)]


def check_oracle(probe: Probe, facts: EnvFacts, solved: dict[int, Solved],
                 global_random: str | None = None, own_api: bool = True) -> None:
    """Replaying each seed's solution() wins. A loss says why, where it can tell: the env draws
    from the global `random` module (`global_random`, from `global_random_use`), a tool-use
    criterion raises after the solution's actions, or which criteria do not hold (`own_api`:
    our ToolUseBaseEnv, not the reference's)."""
    probe.check = "oracle"
    for seed, solution in solved.items():
        actions = solution.actions
        if len(actions) > facts.max_turns:
            fix = (f"set max_turns to at least {len(actions)}, or solve in fewer actions"
                   if len(actions) <= MAX_TURNS_CAP else
                   f"solve in fewer actions (max_turns is at most {MAX_TURNS_CAP})")
            raise ContractError("oracle", f"solution for seed {seed} has {len(actions)} actions, "
                                f"more than max_turns={facts.max_turns}: {fix}")
        terminated, reward = play(probe, seed, replay(actions), len(actions))
        if not terminated or reward <= 0:
            lost = (f"replaying solution() for seed {seed} did not win "
                    f"(terminated={terminated}, reward={reward})")
            why = oracle_reason(probe, facts, global_random, own_api)
            raise ContractError("oracle", f"{lost}: {why}" if why else lost)


def oracle_reason(probe: Probe, facts: EnvFacts, global_random: str | None,
                  own_api: bool) -> str | None:
    """Why a replayed solution lost, when the env shows it (after the replay, before reset)."""
    if global_random:
        return global_random
    if facts.domain != "tool_use" or not own_api:
        return None
    try:
        status = probe.call("criteria").result
    except ContractError:
        status = None
    status = status if isinstance(status, list) else []
    for index, value in enumerate(status):
        if value is not True and value is not False:
            return (f"criterion {index + 1} raises after the solution's actions ({value}); a "
                    "criterion that raises counts as not met, so its request never completes: "
                    "make it return False instead")
    if status and not all(value is True for value in status):
        return f"{sum(v is True for v in status)} of {len(status)} criteria hold after its actions"
    return None


RANDOM_STATE = {"seed", "setstate"}  # a global random seeded from the episode's seed is fine


def global_random_use(tree: ast.Module) -> str | None:
    """The env class's reset/setup (and the methods of its own they call) drawing from the
    global `random` module instead of `self.rng`/`random.Random(seed)`, as a reason, or None.
    A class that seeds the global module there (`random.seed(seed)`, the reference's way) is
    fine."""
    try:
        cls = env_class.env_class(tree)
    except env_class.EnvClassError:
        return None
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "random"}
        elif isinstance(node, ast.ImportFrom) and node.module == "random" and node.level == 0:
            functions |= {a.asname or a.name for a in node.names
                          if a.name not in ("Random", "SystemRandom")}
    if not modules and not functions:
        return None
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    todo, seen, found = [m for m in ("reset", "setup") if m in methods], set(), None
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(methods[name]):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if func.value.id == "self" and func.attr in methods:
                    todo.append(func.attr)
                elif func.value.id in modules:
                    if func.attr in RANDOM_STATE:
                        return None
                    if func.attr not in ("Random",) and found is None:
                        found = (name, node.lineno, f"{func.value.id}.{func.attr}")
            elif isinstance(func, ast.Name) and func.id in functions:
                if func.id in RANDOM_STATE:
                    return None
                if found is None:
                    found = (name, node.lineno, func.id)
    if found is None:
        return None
    method, line, call = found
    return (f"{method}() draws from the global random module (line {line}: {call}), not "
            "self.rng or random.Random(seed): the same seed gives each worker another episode, "
            "so solution(), computed in another worker, does not fit it; draw from self.rng")


def wins_most(episodes: list[Callable[[], bool]]) -> str | None:
    """Play episodes until the majority is decided; "W of N" played when most of them win."""
    wins = losses = 0
    for episode in episodes:
        if 2 * wins > len(episodes) or 2 * losses >= len(episodes):
            break
        if episode():
            wins += 1
        else:
            losses += 1
    return f"{wins} of {wins + losses}" if 2 * wins > len(episodes) else None


def check_trivial(probe: Probe, facts: EnvFacts, solved: dict[int, Solved],
                  own_api: bool = True) -> None:
    """Policies that know nothing of this seed's answer must not win.

    Doing nothing must never win (on IDLE_SEEDS seeds). Generic actions, and another seed's
    solution (where it differs from this seed's), may win an episode by luck (a guess that happens
    to be right), so they fail the env only when they win most of their episodes (play stops once
    that is decided). This seed's own solution actions are never used: they contain the answer. An
    env whose every seed has the same solution, the spare seeds `solve` drew while they agreed
    included (25 seeds: a game of k answers agrees on all by chance with probability k**-24), is
    won by replaying one solution from memory, so it fails, whatever its observations say (the
    coder wrote a game whose goal changed with the seed and whose winning text did not). An env
    without solution()
    is checked by doing nothing and generic actions only: without its answers, seeds whose
    hidden state differs cannot be told from seeds that give the same episode (a code-breaking
    game shows the same rules on every seed, and generic guesses get the same "four digits,
    please").
    """
    probe.check = "trivial"
    seeds = list(solved)
    idle = IDLE_ACTION[facts.domain]
    for seed in seeds[:IDLE_SEEDS]:
        if won(play(probe, seed, lambda turn: idle, facts.max_turns)):
            raise ContractError("trivial", f"doing nothing ({idle!r} every turn) wins "
                                f"(seed {seed})")
    tally = wins_most([lambda seed=seed: won(play(probe, seed, generic_action, facts.max_turns))
                       for seed in seeds])
    if tally:
        raise ContractError("trivial", f"cycling generic actions wins {tally} episodes")
    if facts.oracle and same_episode(solved):
        # our tool-use API's reset is the base class's: what a designer writes there is setup()
        asked = ("does setup() draw the task from self.rng?"
                 if facts.domain == "tool_use" and own_api else "does reset ignore its seed?")
        raise ContractError("trivial", f"all {len(seeds)} seeds give the same episode ({asked}): "
                            "one memorised action list wins every one")
    if facts.oracle and len(seeds) > VALIDATION_SEEDS and same_solution(solved):
        # spare seeds were drawn while the solutions agreed, and every one agreed too
        raise ContractError("trivial", f"all {len(seeds)} seeds have the same solution (does the "
                            "answer ignore the seed?): one memorised action list wins every one")
    pairs = [(seed, solved[other].actions[:facts.max_turns])
             for seed, other in zip(seeds, seeds[1:] + seeds[:1])
             if solved[other].actions not in (None, solved[seed].actions)]
    tally = wins_most([lambda seed=seed, actions=actions:
                       won(play(probe, seed, replay(actions), len(actions)))
                       for seed, actions in pairs])
    if tally:
        raise ContractError("trivial", f"replaying another seed's solution wins {tally} episodes")


def check_reset_gate(probe: Probe, seeds: Sequence[int]) -> None:
    """No criterion holds (or raises) right after reset. The worker computes the status from a
    private copy of tool_base, so an env that overrides or patches it changes nothing."""
    probe.check = "reset_gate"
    for seed in seeds:
        probe.reset(seed)
        status = probe.call("criteria").result
        for index, value in enumerate(status if isinstance(status, list) else [status]):
            if value is True:
                raise ContractError("reset_gate", f"criterion {index + 1} already holds at reset "
                                    f"(seed {seed})")
            if value is not False:
                raise ContractError("reset_gate", f"criterion {index + 1} raises at reset "
                                    f"(seed {seed}): {value}")


def runtime_checks(sandbox: Sandbox, source: str, seeds: Seeds | Sequence[int]) -> EnvFacts:
    """load and every runtime check, in order; raises ContractError on the first failure.
    Given `Seeds`, their `used` ends listing every seed the checks played, spares drawn
    included (a plain sequence of seeds has no spares).

    Two workers: one computes solution() for every seed (started first, it works while the other
    loads and resets), the other plays everything that checks those solutions.
    """
    if not isinstance(seeds, Seeds):
        seeds = Seeds(list(dict.fromkeys(seeds)))
    if len(set(seeds.used)) < 2:
        raise ValueError("runtime checks need at least two distinct seeds")
    first_seeds = list(seeds.used)  # the solving thread may draw spares onto seeds.used
    tree = parse(source)
    env = structure(tree)
    global_random = global_random_use(tree)
    own_api = not reference_tool_base.reference_api(tree)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="solve") as side:
        solving = side.submit(solve, sandbox, source, seeds, env)
        with Worker(sandbox) as worker:
            probe = Probe(worker, REFERENCE_REWARD_BOUND if env.reference else REWARD_BOUND)
            facts = load(probe, source)
            facts.oracle = env.solution
            check_reset(probe, first_seeds)
            solved = solving.result()
            check_reset(probe, seeds.used[len(first_seeds):])
            played = list(solved)
            check_determinism(probe, played[0], solved[played[0]], facts, global_random)
            check_garbage(probe, played[1])
            if facts.oracle:
                check_oracle(probe, facts, solved, global_random, own_api)
            check_trivial(probe, facts, solved, own_api)
            if facts.domain == "tool_use":
                check_reset_gate(probe, played)
                probe.reset(played[0])
                facts.tools = probe.call("tools").result or []
    return facts
