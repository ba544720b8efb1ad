"""The contract's checks: which imports and tool-use classes pass `structure`, how the reset gate
reads an env, and which policies `trivial` counts as knowing nothing of an episode."""

import textwrap

import pytest

from sandbox import tool_base
from sandbox.contract import DENIED_IMPORTS, ContractError, parse, runtime_checks, structure
from sandbox.jail import Sandbox

GAME = '''
class TinyEnv:
    def reset(self, seed=None):
        return "hi", {}

    def step(self, action):
        return "ok", 0.0, False, False, {}

    def solution(self):
        return ["\\\\boxed{1}"]
'''


def structure_of(source: str) -> str:
    return structure(parse(textwrap.dedent(source)))


@pytest.mark.parametrize("line", [
    "import sys", "import datetime", "import hashlib", "import uuid", "import time",
    "import calendar, graphlib, zlib, base64", "import os.path", "from urllib.parse import quote",
    "from http import HTTPStatus", "from __future__ import annotations", "import importlib",
])
def test_any_stdlib_import_passes(line):
    assert structure_of(line + "\n" + GAME) == "TinyEnv"


@pytest.mark.parametrize("line, reason", [
    ("import subprocess", "no programs to run"),
    ("import socket", "no network"),
    ("from urllib import request", "no network"),
    ("import urllib.request", "no network"),
    ("from socket import create_connection", "no network"),
    ("import ctypes.util", "native code"),
    ("import math_verify", "not in the standard library"),
    ("import numpy as np", "not in the standard library"),
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
    assert structure_of(TOOL_ENV) == "DeskEnv"


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


def test_a_game_any_other_episodes_answer_wins_is_trivial(jail_available):
    with pytest.raises(ContractError) as caught:
        runtime_checks(Sandbox(), SLOPPY_GUESS, SEEDS)
    assert caught.value.check == "trivial"
    assert "another seed's solution wins 3 of 3" in caught.value.msg


def test_a_one_action_game_whose_answer_is_its_solution_passes(jail_available):
    exact = SLOPPY_GUESS.replace("abs(int(found[-1]) - self.secret) < 100000",
                                 "int(found[-1]) == self.secret")
    facts = runtime_checks(Sandbox(), exact, SEEDS)
    assert facts.class_name == "SloppyGuessEnv" and facts.max_turns == 5


def test_the_same_answer_on_every_seed_passes_when_the_episodes_differ(jail_available):
    same_answer = SLOPPY_GUESS.replace(
        'return "Guess a five-digit number with \\\\boxed{n}.", {}',
        'return f"Guess a five-digit number with \\\\boxed{{n}} (seed tag {self.secret}).", {}'
    ).replace("abs(int(found[-1]) - self.secret) < 100000", "int(found[-1]) == 12345").replace(
        '"\\\\boxed{%d}" % self.secret', '"\\\\boxed{12345}"')
    assert "seed tag" in same_answer and "== 12345" in same_answer
    assert runtime_checks(Sandbox(), same_answer, SEEDS).class_name == "SloppyGuessEnv"
