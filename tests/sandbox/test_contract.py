"""The contract's checks: which imports and tool-use classes pass `structure`, how the reset gate
reads an env, which policies `trivial` counts as knowing nothing of an episode, and how envs in
the reference code's format (its base class, games without solution(), bare answers, rewards up
to +-10) are played and checked."""

import pytest

from sandbox import reference_tool_base, tool_base
from sandbox.contract import (DENIED_IMPORTS, MAX_TURNS_CAP, SPARE_SEEDS, ContractError,
                              EnvClass, Seeds, runtime_checks)
from sandbox.jail import Sandbox
from tests.sandbox.tiny_env import GAME, structure_of


@pytest.mark.parametrize("line", [
    "import sys", "import datetime", "import hashlib", "import uuid", "import time",
    "import calendar, graphlib, zlib, base64", "import os.path", "from urllib.parse import quote",
    "from http import HTTPStatus", "from __future__ import annotations", "import importlib",
    "from math_verify import parse, verify", "import math_verify",
])
def test_any_stdlib_import_and_the_math_verify_stand_in_pass(line):
    assert structure_of(line + "\n" + GAME).name == "TinyEnv"


@pytest.mark.parametrize("line, reason", [
    ("import subprocess", "no programs to run"),
    ("import socket", "no network"),
    ("from urllib import request", "no network"),
    ("import urllib.request", "no network"),
    ("from socket import create_connection", "no network"),
    ("import ctypes.util", "native code"),
    ("from math_verify import LatexExtractionConfig", "stand-in that has only parse and verify"),
    ("import math_verify.grader", "stand-in that has only parse and verify"),
    ("import numpy as np", "the jail has no third-party packages"),
    ("from . import helpers", "relative imports"),
])
def test_denied_and_non_stdlib_imports_fail_structure_with_the_reason(line, reason):
    with pytest.raises(ContractError) as caught:
        structure_of(line + "\n" + GAME)
    assert caught.value.check == "structure" and reason in caught.value.msg
    assert caught.value.msg.startswith("line 1: ")


def test_every_denied_import_says_why():
    assert all(reason.strip() for reason in DENIED_IMPORTS.values())


TOOL_ENV = '''
class DeskEnv(ToolUseBaseEnv):
    max_turns = 8

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def setup(self):
        self.tools, self.state, self.instructions, self.criteria = {}, {}, [], []

    def _helper(self):
        return 1

    def tool_look(self):
        return "desk"

    def close(self):
        pass

    def solution(self):
        return ["<answer>done</answer>"]
'''


def test_tool_use_env_may_define_its_own_parts():
    assert structure_of(TOOL_ENV) == EnvClass("DeskEnv", reference=False, solution=True)


@pytest.mark.parametrize("name", ["reset", "step", "_advance", "_met", "execute_tool", "get_tools"])
def test_tool_use_env_may_not_redefine_base_internals(name):
    source = TOOL_ENV + f"\n    def {name}(self, *args):\n        return None\n"
    with pytest.raises(ContractError) as caught:
        structure_of(source)
    assert caught.value.check == "structure"
    assert f"redefines ToolUseBaseEnv.{name}" in caught.value.msg


def test_reset_gate_reads_the_instance_whatever_the_class_says():
    class SneakyEnv(tool_base.ToolUseBaseEnv):
        def setup(self):
            self.state = {"done": True}
            self.criteria = [lambda state: state["done"], lambda state: state["missing"]]
            self.instructions = ["a", "b"]

        def __getattribute__(self, name):
            return [] if name == "criteria" else super().__getattribute__(name)

    env = SneakyEnv()
    env.reset(seed=1)
    assert tool_base.criteria_status(env) == [True, "KeyError: 'missing'"]


SLOPPY_GUESS = '''
import random
import re


class SloppyGuessEnv:
    max_turns = 5

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(10000, 99999)
        return "Guess a five-digit number with \\\\boxed{n}.", {}

    def step(self, action):
        found = re.findall(r"\\\\boxed\\{(\\d{5})\\}", action)
        if not found:
            return "Five digits, please.", 0.0, False, False, {}
        close_enough = abs(int(found[-1]) - self.secret) < 100000  # meant: == self.secret
        return "Done.", float(close_enough), True, False, {}

    def solution(self):
        return ["\\\\boxed{%d}" % self.secret]
'''
SEEDS = [101, 202, 303, 404, 505]


def test_a_game_any_other_episodes_answer_wins_is_trivial(nsjail_ok):
    with pytest.raises(ContractError) as caught:
        runtime_checks(Sandbox(), SLOPPY_GUESS, SEEDS)
    assert caught.value.check == "trivial"
    assert "another seed's solution wins 3 of 3" in caught.value.msg


def test_a_one_action_game_whose_answer_is_its_solution_passes(nsjail_ok):
    exact = SLOPPY_GUESS.replace("abs(int(found[-1]) - self.secret) < 100000",
                                 "int(found[-1]) == self.secret")
    facts = runtime_checks(Sandbox(), exact, SEEDS)
    assert facts.class_name == "SloppyGuessEnv" and facts.max_turns == 5


def test_the_same_answer_on_every_seed_is_trivial_whatever_the_observation(nsjail_ok):
    """A goal that changes with the seed and a winning text that does not (the coder's game):
    one memorised answer wins every episode, over the 5 seeds and the 20 spare ones drawn."""
    same_answer = SLOPPY_GUESS.replace(
        'return "Guess a five-digit number with \\\\boxed{n}.", {}',
        'return f"Guess a five-digit number with \\\\boxed{{n}} (seed tag {self.secret}).", {}'
    ).replace("abs(int(found[-1]) - self.secret) < 100000", "int(found[-1]) == 12345").replace(
        '"\\\\boxed{%d}" % self.secret', '"\\\\boxed{12345}"')
    assert "seed tag" in same_answer and "== 12345" in same_answer
    spares = list(range(1000, 1000 + SPARE_SEEDS))
    with pytest.raises(ContractError) as caught:
        runtime_checks(Sandbox(), same_answer, Seeds(list(SEEDS), spares))
    assert caught.value.check == "trivial"
    assert caught.value.msg.startswith(f"all {len(SEEDS) + SPARE_SEEDS} seeds have the same "
                                       "solution")
    # without spare seeds to tell luck from a fixed answer, five agreeing seeds are allowed
    assert runtime_checks(Sandbox(), same_answer, SEEDS).class_name == "SloppyGuessEnv"


# -- envs in the reference code's format --------------------------------------------------------

REFERENCE_TOOL = '''
class LookupEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self._tools = {"lookup": {"description": "d", "parameters": {"type": "object",
                       "properties": {"key": {"type": "string"}, "page": {"type": "integer"}}}}}
        self._state = {"a": 1}
        self._expected_answer = "1"
        return "Find a.", {}

    def step(self, action):
        return super().step(action)

    def tool_lookup(self, key="", page=1):
        return str(self._state.get(key, "none"))

    def solution(self):
        return "lookup(key='a') ANSWER: 1"
'''


@pytest.mark.parametrize("source, expected", [
    (REFERENCE_TOOL, EnvClass("LookupEnv", reference=True, solution=True)),
    (TOOL_ENV, EnvClass("DeskEnv", reference=False, solution=True)),
    (GAME, EnvClass("TinyEnv", reference=False, solution=True)),
    (GAME.replace("class TinyEnv:", "class TinyEnv:\n    def __init__(self, max_turns=10, **kw):"
                  "\n        self.max_turns = max_turns\n"),
     EnvClass("TinyEnv", reference=True, solution=True)),
    (GAME.replace("class TinyEnv:", "class TinyEnv:\n    def __init__(self, max_turns=10, **kw):"
                  "\n        self.max_turns = max_turns\n").split("    def solution")[0],
     EnvClass("TinyEnv", reference=True, solution=False)),
])
def test_structure_tells_the_reference_format_and_a_missing_solution(source, expected):
    assert structure_of(source) == expected


def test_a_game_in_our_format_without_solution_is_a_structure_reject():
    """Without solution() no check can tell a winnable game from one no agent can win: the
    coder wrote one that only its own observation's text could win, and it was accepted."""
    with pytest.raises(ContractError) as caught:
        structure_of(GAME.split("    def solution")[0])
    assert caught.value.check == "structure"
    assert caught.value.msg.startswith("class TinyEnv lacks solution: a game defines solution()")


def test_a_reference_tool_use_env_needs_reset_and_solution_not_setup():
    with pytest.raises(ContractError) as caught:
        structure_of(REFERENCE_TOOL.replace("def solution", "def answer_key"))
    assert caught.value.msg == "class LookupEnv lacks solution"


class ReferenceDesk(reference_tool_base.ToolUseBaseEnv):
    """A reference-API env played host-side: the base class is plain Python."""

    def reset(self, seed=None):
        self.turn_count = 0
        self._tools = {"add": {"description": "Add", "parameters": {
            "type": "object", "properties": {"name": {}, "count": {}}}}}
        self._state = {"items": []}
        self._expected_answer = "$1,000"
        return "Add two items, then answer 1000.", {}

    def tool_add(self, name="", count=1):
        self._state["items"].append(name)
        return f"added {name}"

    def solution(self):
        return "1. add(name='pen') 2. add('cup', 2)\n<answer>1000</answer>"


def test_the_reference_base_plays_one_call_a_turn_and_checks_the_answer_first():
    env = ReferenceDesk(max_turns=4)
    calls = '<tool_call>{"name": "add", "arguments": {"name": "pen"}}</tool_call>' \
            '<tool_call>{"name": "add", "arguments": {"name": "cup"}}</tool_call>'
    assert env.step(calls) == ("Tool result:\nadded pen", 0.0, False, False, {})
    assert env._state["items"] == ["pen"]  # one tool call per action, as the reference plays
    assert env.step("no markup")[1:3] == (-0.1, False)
    assert env.step(calls + "<answer>1,000.004</answer>") == ("Correct!", 1.0, True, False, {})


def test_the_reference_base_reveals_the_solution_on_the_last_turn():
    env = ReferenceDesk(max_turns=2)
    env.step("<answer>7</answer>")
    observation, reward, terminated, truncated, _ = env.step("<answer>7</answer>")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert observation.startswith("Wrong answer. Solution:\n1. add(name='pen')")


def test_a_reference_solution_text_becomes_one_tool_call_per_action():
    env = ReferenceDesk()
    assert reference_tool_base.solution_actions(env) == [
        '<tool_call>{"name": "add", "arguments": {"name": "pen"}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"name": "cup", "count": 2}}</tool_call>',
        "<answer>$1,000</answer>"]  # _expected_answer, the value the base class checks


@pytest.mark.parametrize("text, calls, answer", [
    ('<tool_call>{"name": "add", "arguments": {"name": "a"}}</tool_call>\nANSWER: 5',
     ['{"name": "add", "arguments": {"name": "a"}}'], "5"),
    ("first tool_add(name=report) then add(name=\"b c\", count=3) -> added", [
        '{"name": "add", "arguments": {"name": "report"}}',
        '{"name": "add", "arguments": {"name": "b c", "count": 3}}'], None),
    ("readd(name='x') is no call of ours", [], None),
])
def test_the_solution_parse_reads_json_blocks_and_call_notation(text, calls, answer):
    env = ReferenceDesk()
    env._expected_answer = None
    env.solution = lambda: text
    finish = [] if answer is None else [f"<answer>{answer}</answer>"]
    assert reference_tool_base.solution_actions(env) == \
        [f"<tool_call>{call}</tool_call>" for call in calls] + finish


class Unbuildable:
    def __init__(self, max_turns):
        self.max_turns = max_turns


class Paced:
    def __init__(self, max_turns=40, **kwargs):
        self.max_turns = max_turns


class Plain:
    max_turns = 7


@pytest.mark.parametrize("cls, max_turns", [
    (Unbuildable, MAX_TURNS_CAP), (Paced, MAX_TURNS_CAP), (ReferenceDesk, 10), (Plain, 7)])
def test_a_class_taking_max_turns_is_built_with_its_default_capped(cls, max_turns):
    assert reference_tool_base.build(cls).max_turns == max_turns


REFERENCE_GAME = '''
from math_verify import parse, verify


class SumGuessEnv:
    def __init__(self, max_turns=6, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self.reset()

    def reset(self, seed=None):
        if seed is not None:
            random.seed(seed)
        self.turn_count = 0
        self.parts = Counter(random.choice("abcdef") for _ in range(30))
        return f"Counts: {sorted(self.parts.items())}. Answer the count of 'a' times 7/4.", {}

    def solution(self):
        return SOLUTION

    def step(self, action):
        self.turn_count += 1
        match = re.search(r"\\\\boxed\\{([^}]+)\\}", action)
        if match and verify(parse(match.group(1)), parse(str(self.parts["a"] * 7 / 4))):
            return "Correct!", WIN, True, False, {}
        return "Wrong.", 0.0, False, self.turn_count >= self.max_turns, {}
'''


def reference_game(solution="f'{self.parts[\"a\"] * 7}/4'", win="1.0"):
    return REFERENCE_GAME.replace("SOLUTION", solution).replace("WIN", win)


@pytest.mark.parametrize("solution", [
    "f'{self.parts[\"a\"] * 7}/4'",  # a bare answer: boxed for the oracle; math_verify equates it
    "self.parts['a'] * 7 / 4",  # a number
    "['\\\\\\\\boxed{%s}' % (self.parts['a'] * 7 / 4)]",  # our own format
])
def test_a_reference_game_passes_with_injected_names_math_verify_and_a_bare_answer(
        solution, nsjail_ok):
    facts = runtime_checks(Sandbox(), reference_game(solution), SEEDS)
    assert (facts.class_name, facts.max_turns, facts.oracle) == ("SumGuessEnv", 6, True)


@pytest.mark.parametrize("win, accepted", [("10.0", True), ("10.5", False)])
def test_a_reference_game_may_pay_up_to_ten(win, accepted, nsjail_ok):
    source = reference_game(win=win)
    if accepted:
        assert runtime_checks(Sandbox(), source, SEEDS).class_name == "SumGuessEnv"
        return
    with pytest.raises(ContractError) as caught:
        runtime_checks(Sandbox(), source, SEEDS)
    assert caught.value.check == "step_types" and "outside [-10, 10]" in caught.value.msg


def test_a_native_game_still_pays_within_one(nsjail_ok):
    native = reference_game(win="2.0").replace(
        "def __init__(self, max_turns=6, **kwargs):\n        self.max_turns = max_turns",
        "max_turns = 6\n\n    def __init__(self):")
    with pytest.raises(ContractError) as caught:
        runtime_checks(Sandbox(), native, SEEDS)
    assert caught.value.check == "step_types" and "outside [-1, 1]" in caught.value.msg


def test_a_game_without_solution_passes_every_check_but_the_oracle(nsjail_ok):
    facts = runtime_checks(Sandbox(), reference_game().split("    def solution")[0] +
                           "    def step" + reference_game().split("    def step")[1], SEEDS)
    assert facts.oracle is False


def test_a_game_without_solution_is_still_replayed_for_determinism(nsjail_ok):
    source = reference_game().split("    def solution")[0] + "    def step" + \
        reference_game().split("    def step")[1].replace(
            'return "Wrong.", 0.0', 'WRONG.append(1)\n        return f"Wrong x{len(WRONG)}.", 0.0')
    source = "WRONG = []  # every wrong answer this process saw: replays differ\n" + source
    with pytest.raises(ContractError) as caught:
        runtime_checks(Sandbox(), source, SEEDS)
    assert caught.value.check == "determinism"


def test_a_reference_tool_use_env_is_played_and_checked_with_the_reference_base(nsjail_ok):
    source = REFERENCE_TOOL.replace('"a": 1', '"a": random.randint(10, 99)').replace(
        'self._expected_answer = "1"', 'self._expected_answer = str(self._state["a"])')
    source = "import random\n" + source.replace(
        "def reset(self, seed=None):", "def reset(self, seed=None):\n        random.seed(seed)"
    ).replace('"lookup(key=\'a\') ANSWER: 1"', '"lookup(key=\'a\')"')
    facts = runtime_checks(Sandbox(), source, SEEDS)
    assert (facts.domain, facts.max_turns, facts.oracle) == ("tool_use", 10, True)
    assert [tool["function"]["name"] for tool in facts.tools] == ["lookup"]


@pytest.mark.parametrize("name", ["designer_game", "designer_tool_use"])
def test_designer_prompts_allow_the_stdlib_and_name_exactly_the_deny_list(name):
    from stages import prompts

    text = " ".join(prompts.template(name).split())
    listed = text.split(" except ", 1)[1].split(" (the sandbox", 1)[0]
    assert listed.replace(" and ", ", ").split(", ") == list(DENIED_IMPORTS)
    assert "any standard-library module" in text and "no third-party package" in text
