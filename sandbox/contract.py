"""The environment contract as named checks, run in a fixed order.

In: a model's answer (text) or an env program's source. Out: the first failing check as
`ContractError(check, msg, outcome)`, or the facts `rollout` needs (`EnvFacts`).
Guarantees: static checks never execute the code; every runtime check talks to the env only
through a jailed `Worker`; a timeout, memory or output outcome anywhere is reported by the
`resources` check, whatever check was running.

Order: extract, parse, structure, load, reset, determinism, garbage, step_types, oracle, trivial,
resources, reset_gate (tool use only). See DESIGN.md section 4.
"""

from __future__ import annotations

import ast
import math
import random
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from sandbox.jail import Reply, SandboxUnavailable, Worker

CHECKS = ("extract", "parse", "structure", "load", "reset", "determinism", "garbage",
          "step_types", "oracle", "trivial", "resources", "reset_gate")
ALLOWED_IMPORTS = frozenset(
    "math random re itertools collections functools heapq bisect string json dataclasses "
    "typing enum fractions decimal statistics copy textwrap operator abc numbers".split())
MAX_TURNS_CAP = 25
RESET_SEEDS = (0, 1, 2, 42, 123)
ORACLE_SEEDS = (0, 1, 2)
RANDOM_POLICY_SEEDS = (0, 1, 2, 3)
GARBAGE_ACTIONS = ("", "hello", "\\boxed{}", "\\boxed{zzz}", "\\boxed{-1}", "\\boxed{1 2 3}",
                   "\\boxed{\\boxed{}}", "Ω≈ç√ 🂡", "x" * 5000, "<tool_call>{bad json</tool_call>",
                   '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                   "<answer>done</answer>", "\\boxed{" + "9" * 400 + "}")
FENCE_RE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


class ContractError(Exception):
    def __init__(self, check: str, msg: str, outcome: str = "ok"):
        super().__init__(f"{check}: {msg}")
        self.check, self.msg, self.outcome = check, msg, outcome


@dataclass
class EnvFacts:
    class_name: str
    domain: str
    max_turns: int
    tools: list[dict[str, Any]] = field(default_factory=list)


# -- static checks: they never run the code ------------------------------------------------------

def extract(text: str) -> str:
    """The ```python block of a model's answer (the longest, when there are several)."""
    blocks = [b for b in FENCE_RE.findall(text) if b.strip()]
    if not blocks:
        raise ContractError("extract", "no ```python code block in the answer")
    return max(blocks, key=len).strip("\n") + "\n"


_AST_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    # CPython 3.11's AST constructor keeps a recursion counter that concurrent ast.parse calls
    # corrupt ("AST constructor recursion depth mismatch"); validate runs checks in threads.
    try:
        with _AST_LOCK:
            return ast.parse(source)
    except SyntaxError as exc:
        raise ContractError("parse", f"line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:  # null bytes
        raise ContractError("parse", str(exc)) from None


def structure(tree: ast.Module) -> str:
    """Check imports and the env class; returns the class name."""
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or "."] if node.level == 0 else ["."]
        for name in names:
            if name.split(".")[0] not in ALLOWED_IMPORTS:
                raise ContractError("structure", f"line {node.lineno}: import of '{name}' is not "
                                    "allowed (stdlib allow-list only)")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Env") \
                and node.name != "ToolUseBaseEnv":
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            tool_use = any(isinstance(b, ast.Name) and b.id == "ToolUseBaseEnv" for b in node.bases)
            needed = {"setup", "solution"} if tool_use else {"reset", "step", "solution"}
            missing = needed - methods
            if missing:
                raise ContractError("structure", f"class {node.name} lacks "
                                    f"{', '.join(sorted(missing))}")
            return node.name
    raise ContractError("structure", "no top-level class whose name ends in 'Env'")


def static_checks(text: str, is_source: bool = False) -> str:
    """extract, parse, structure; returns the source."""
    source = text if is_source else extract(text)
    structure(parse(source))
    return source


# -- runtime checks: through the jailed worker ---------------------------------------------------

class Probe:
    """Calls into the worker, turning any non-ok reply into the running check's failure."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.check = "load"

    def call(self, op: str, **fields: Any) -> Reply:
        reply = self.worker.call(op, **fields)
        if reply.outcome == "sandbox_failure":
            raise SandboxUnavailable((reply.error or {}).get("msg", "sandbox failure"))
        if reply.outcome in ("timeout", "oom", "output_limit"):
            raise ContractError("resources", f"{reply.outcome} during {self.check} "
                                f"({op}): {(reply.error or {}).get('msg', '')}", reply.outcome)
        if not reply.ok:
            error = reply.error or {}
            raise ContractError(self.check, f"{op} raised {error.get('type')}: "
                                f"{error.get('msg', '')}".strip(), reply.outcome)
        return reply

    def reset(self, seed: int) -> Any:
        reply = self.call("reset", seed=seed)
        if reply.shape != ["tuple", 2] or not isinstance(reply.result[0], str) \
                or not isinstance(reply.result[1], dict):
            raise ContractError(self.check, f"reset(seed={seed}) must return (str, dict), got "
                                f"{describe(reply)}")
        if not reply.result[0].strip():
            raise ContractError(self.check, f"reset(seed={seed}) returned an empty observation")
        return reply.result

    def step(self, action: str) -> list:
        reply = self.call("step", action=action)
        problem = step_problem(reply)
        if problem:
            raise ContractError("step_types", f"step({short(action)}) {problem}")
        return reply.result


def describe(reply: Reply) -> str:
    kind, size = (reply.shape or ["?", None])
    return f"{kind} of length {size}" if size is not None else kind


def short(action: str) -> str:
    return repr(action if len(action) <= 40 else action[:37] + "...")


def step_problem(reply: Reply) -> str | None:
    if reply.shape != ["tuple", 5]:
        return f"must return a 5-tuple (obs, reward, terminated, truncated, info), got {describe(reply)}"
    obs, reward, terminated, truncated, info = reply.result
    if not isinstance(obs, str):
        return f"observation must be str, got {type(obs).__name__}"
    if isinstance(reward, dict) and "__float__" in reward:
        return f"reward is {reward['__float__']}"
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return f"reward must be a number, got {type(reward).__name__}"
    if not math.isfinite(reward) or not -1.0 <= reward <= 1.0:
        return f"reward {reward} is outside [-1, 1]"
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        return "terminated and truncated must be bools"
    if not isinstance(info, dict):
        return f"info must be a dict, got {type(info).__name__}"
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


def check_reset(probe: Probe, facts: EnvFacts) -> None:
    probe.check = "reset"
    for seed in RESET_SEEDS:
        probe.reset(seed)


def solution_actions(probe: Probe) -> list[str]:
    reply = probe.call("solution")
    actions = reply.result
    if isinstance(actions, str):
        actions = [line for line in actions.splitlines() if line.strip()] or [actions]
    if not isinstance(actions, list) or not actions or not all(isinstance(a, str) for a in actions):
        raise ContractError(probe.check, "solution() must return a non-empty list of action "
                            f"strings, got {describe(reply)}")
    return actions


def trace(probe: Probe, seed: int, actions: list[str]) -> list:
    steps: list = [probe.reset(seed)]
    for action in actions:
        steps.append(probe.step(action))
        if steps[-1][2] or steps[-1][3]:
            break
    return steps


def check_determinism(probe: Probe, facts: EnvFacts) -> None:
    probe.check = "determinism"
    probe.reset(7)
    actions = solution_actions(probe)[:4] + ["\\boxed{zzz}"]
    first, second = trace(probe, 7, actions), trace(probe, 7, actions)
    for index, (a, b) in enumerate(zip(first, second)):
        if a != b:
            where = "reset(seed=7)" if index == 0 else f"step {index}"
            raise ContractError("determinism", f"same seed and actions gave different results "
                                f"at {where}")


def check_garbage(probe: Probe, facts: EnvFacts) -> None:
    probe.check = "garbage"
    probe.reset(3)
    for action in GARBAGE_ACTIONS:
        reply = probe.call("step", action=action)
        problem = step_problem(reply)
        if problem:
            raise ContractError("step_types", f"step({short(action)}) {problem}")
        if reply.result[2] or reply.result[3]:
            probe.reset(3)


def check_step_types(probe: Probe, facts: EnvFacts) -> None:
    probe.check = "step_types"
    probe.reset(5)
    for action in solution_actions(probe)[:facts.max_turns]:
        obs, reward, terminated, truncated, info = probe.step(action)
        if terminated or truncated:
            break


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


def check_oracle(probe: Probe, facts: EnvFacts) -> None:
    probe.check = "oracle"
    for seed in ORACLE_SEEDS:
        probe.reset(seed)
        actions = solution_actions(probe)
        if len(actions) > facts.max_turns:
            raise ContractError("oracle", f"solution for seed {seed} has {len(actions)} actions, "
                                f"more than max_turns={facts.max_turns}")
        terminated, reward = play(probe, seed, lambda turn: actions[turn] if turn < len(actions)
                                  else "", len(actions))
        if not terminated or reward <= 0:
            raise ContractError("oracle", f"replaying solution() for seed {seed} did not win "
                                f"(terminated={terminated}, reward={reward})")


def won(outcome: tuple[bool, float]) -> bool:
    return outcome[0] and outcome[1] > 0


def check_trivial(probe: Probe, facts: EnvFacts) -> None:
    probe.check = "trivial"
    probe.reset(0)
    actions = solution_actions(probe)
    idle = "<answer>done</answer>" if facts.domain == "tool_use" else "\\boxed{}"
    for name, action in (("an empty action", idle), ("repeating the first solution action",
                                                      actions[0])):
        if won(play(probe, 0, lambda turn: action, facts.max_turns)):
            raise ContractError("trivial", f"{name} wins")
    wins = 0
    for seed in RANDOM_POLICY_SEEDS:
        probe.reset(seed)
        vocabulary = sorted(set(solution_actions(probe)))
        rng = random.Random(seed)
        wins += won(play(probe, seed, lambda turn: rng.choice(vocabulary), facts.max_turns))
    if wins == len(RANDOM_POLICY_SEEDS):
        raise ContractError("trivial", f"a random policy over the solution's actions won "
                            f"{wins} of {wins} episodes")


def check_reset_gate(probe: Probe, facts: EnvFacts) -> None:
    if facts.domain != "tool_use":
        return
    probe.check = "reset_gate"
    for seed in ORACLE_SEEDS:
        probe.reset(seed)
        status = probe.call("criteria").result
        for index, value in enumerate(status or []):
            if value is True:
                raise ContractError("reset_gate", f"criterion {index + 1} already holds at reset "
                                    f"(seed {seed})")
            if value is not False:
                raise ContractError("reset_gate", f"criterion {index + 1} raises at reset "
                                    f"(seed {seed}): {value}")


RUNTIME_CHECKS = (check_reset, check_determinism, check_garbage, check_step_types, check_oracle,
                  check_trivial, check_reset_gate)


def runtime_checks(worker: Worker, source: str) -> EnvFacts:
    """load and every runtime check, in order; raises ContractError on the first failure."""
    probe = Probe(worker)
    facts = load(probe, source)
    for check in RUNTIME_CHECKS:
        check(probe, facts)
    if facts.domain == "tool_use":
        probe.reset(0)
        facts.tools = probe.call("tools").result or []
    return facts
