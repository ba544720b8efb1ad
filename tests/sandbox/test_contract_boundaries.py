"""sandbox/contract.py at its limits, without a jail: the source size cap on both sides (in UTF-8
bytes), which code block an answer gives, the messages of the static checks a designer reads,
a restated ToolUseBaseEnv, and the runtime checks' verdicts on replies an in-process stand-in for
the worker gives (resources, policy, step types, max_turns, solution() shapes, the majority
rule of `trivial`, the reset gate); then every runtime check on an env played in-process
(tests/sandbox/env_worker.py): the determinism replay and its probe step past the solution, the
oracle (a terminal reward of 0 is no win) and its reasons, garbage, trivial's memorised answers,
solve's spare seeds, and all of them in order."""

from __future__ import annotations

import ast
import sys
import textwrap

import pytest

from sandbox import contract, env_class
from sandbox.contract import (MAX_SOURCE_BYTES, MAX_TURNS_CAP, ContractError, EnvFacts, Probe,
                              Seeds, check_size, extract, parse, static_checks)
from sandbox.jail import Limits, Reply, Sandbox, SandboxUnavailable
from tests.sandbox.env_worker import EnvWorker, GuessEnv, Jail
from tests.sandbox.tiny_env import GAME, structure_of


def rejected(call, *args, **kwargs):
    with pytest.raises(ContractError) as raised:
        call(*args, **kwargs)
    return raised.value


# -- extract and the size cap --------------------------------------------------------------------

def test_an_answer_without_a_python_block_is_an_extract_reject():
    err = rejected(extract, "here is my env:\n```\nclass A: pass\n```\n")
    assert (err.check, err.msg, err.outcome) == ("extract", "no ```python code block in the answer",
                                                 "ok")
    assert str(err) == "extract: no ```python code block in the answer"
    assert rejected(extract, "```python\n  \n\n```").check == "extract"  # blank block


@pytest.mark.parametrize("fence", ["```python", "```py", "```Python", "```PY", "```python \t"])
def test_python_and_py_fences_in_any_case_are_read(fence):
    assert extract(f"text\n{fence}\nx = 1\n```\nmore") == "x = 1\n"


def test_the_longest_block_is_the_env_and_a_cut_off_block_counts():
    answer = "```python\nshort = 1\n```\n```python\n\n\nlonger = 22\n\n```\n```python\ncut = 3"
    assert extract(answer) == "longer = 22\n"
    assert extract("```python\ncut = 3") == "cut = 3\n"


def test_a_source_of_exactly_the_cap_in_utf8_bytes_passes_and_one_byte_more_fails():
    assert MAX_SOURCE_BYTES == 256 * 1024
    exact = "#" + "é" * ((MAX_SOURCE_BYTES - 2) // 2) + "\n"
    assert len(exact.encode()) == MAX_SOURCE_BYTES and check_size(exact) == exact
    over = "#" + exact
    err = rejected(check_size, over)
    assert err.check == "extract"
    assert err.msg == (f"the env's source is {MAX_SOURCE_BYTES + 1} bytes, more than the "
                       f"{MAX_SOURCE_BYTES} (256 KiB) an env may have")
    assert rejected(extract, f"```python\n{over}```").msg == err.msg


def test_a_source_longer_than_the_cap_in_characters_is_named_by_its_length():
    err = rejected(check_size, "x" * (MAX_SOURCE_BYTES + 10))
    assert err.msg.startswith(f"the env's source is {MAX_SOURCE_BYTES + 10} bytes")
    assert check_size("\ud800") == "\ud800"  # a lone surrogate is counted, not an error


def test_static_checks_of_a_source_skip_extract_but_not_the_cap():
    assert static_checks(GAME, is_source=True) == GAME
    assert static_checks(f"```python\n{GAME}```") == GAME
    assert rejected(static_checks, GAME).check == "extract"  # an answer needs its block
    assert rejected(static_checks, GAME + "#" * MAX_SOURCE_BYTES, True).check == "extract"


# -- parse ---------------------------------------------------------------------------------------

def test_a_syntax_error_names_its_line():
    err = rejected(parse, "x = 1\ndef f(:\n    pass\n")
    assert err.check == "parse" and err.msg == "line 2: invalid syntax"


def test_a_null_byte_is_a_parse_reject_without_a_line_of_none():
    err = rejected(parse, "x = 1\0\n")
    assert err.check == "parse" and err.msg == "source code string cannot contain null bytes"


def test_nesting_too_deep_for_the_parser_says_what_to_do():
    err = rejected(parse, "x = " + "-" * 100_000 + "1\n")
    assert err.check == "parse"
    assert err.msg.startswith("the source nests too deeply for Python's parser (")
    assert err.msg.endswith("); write long expressions as loops or data")


# -- imports -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,problem", [
    ("json", None), ("os.path", None), ("http", None), ("xml.etree.ElementTree", None),
    ("math_verify", None), ("math_verify.parse", None), ("math_verify.verify", None),
    ("math_verify.grader", "the jail's math_verify is a stand-in that has only parse and verify"),
    (".", "relative imports are not allowed (an env is one module)"),
    ("numpy", "not in the standard library: the jail has no third-party packages (an env may "
              "import the stdlib, and parse and verify from math_verify)"),
    ("socket", contract.NO_NETWORK), ("http.client", contract.NO_NETWORK),
    ("xmlrpc.client", contract.NO_NETWORK), ("ctypes.util", contract.DENIED_IMPORTS["ctypes"]),
    ("subprocess", contract.DENIED_IMPORTS["subprocess"]),
])
def test_which_imports_an_env_may_make_and_why_not(name, problem):
    assert contract.import_problem(name) == problem


@pytest.mark.parametrize("line,name", [
    ("import json, socket", "socket"), ("from urllib import request", "urllib.request"),
    ("from . import helpers", "."), ("from .helpers import x", "."),
    ("import math_verify.grader", "math_verify.grader")])
def test_a_refused_import_names_its_line_and_module(line, name):
    err = rejected(structure_of, "import re\n\n" + line + "\n" + GAME)
    assert err.check == "structure"
    assert err.msg.startswith(f"line 3: import of '{name}' is not allowed: ")


def test_imports_inside_a_method_are_checked_too():
    source = GAME.replace('        return "hi", {}', '        import ssl\n        return "hi", {}')
    assert rejected(structure_of, source).msg.startswith("line 3: import of 'ssl'")


# -- the env class -------------------------------------------------------------------------------

@pytest.mark.parametrize("drop,missing", [("step", "step"), ("reset", "reset")])
def test_a_game_without_reset_or_step_is_told_what_it_lacks(drop, missing):
    source = GAME.replace(f"def {drop}(", f"def _{drop}(")
    err = rejected(structure_of, source)
    assert err.msg == f"class TinyEnv lacks {missing}"


def test_a_game_lacking_both_methods_lists_them_sorted():
    source = "class TinyEnv:\n    x = 1\n"
    assert rejected(structure_of, source).msg == "class TinyEnv lacks reset, solution, step"


def test_a_tool_use_env_needs_setup_and_solution():
    source = "class DeskEnv(ToolUseBaseEnv):\n    max_turns = 3\n"
    assert rejected(structure_of, source).msg == "class DeskEnv lacks setup, solution"


def test_a_tool_use_env_redefining_a_base_internal_is_told_its_line():
    source = ("class DeskEnv(ToolUseBaseEnv):\n    def setup(self):\n        pass\n"
              "    def solution(self):\n        return []\n    _answer = 3\n")
    err = rejected(structure_of, source)
    assert err.msg.startswith("line 6: class DeskEnv redefines ToolUseBaseEnv._answer; a "
                              "tool-use env defines setup")


def test_names_bound_by_assignments_count_as_defined():
    source = ("class DeskEnv(ToolUseBaseEnv):\n    setup: object = None\n"
              "    solution = lambda self: []\n    a, (b, c) = 1, (2, 3)\n    n = 0\n    n += 1\n")
    assert structure_of(source).name == "DeskEnv"
    tree = ast.parse(source)
    assert env_class.class_bindings(tree.body[0]) == {"setup": 2, "solution": 3, "a": 4,
                                                      "b": 4, "c": 4, "n": 6}


def test_a_class_patched_at_import_time_is_a_structure_reject():
    err = rejected(structure_of, GAME + "\nTinyEnv.step = lambda self, a: None\n")
    assert err.check == "structure"
    assert err.msg.endswith(": an env's classes are what their class statements define; put "
                            "every method in the class body")


@pytest.mark.parametrize("init,reference", [
    ("def __init__(self, max_turns=10, **kwargs):", True),
    ("def __init__(self, *, max_turns=10):", True),
    ("def __init__(self, turns=10):", False),
    ("def helper(self, max_turns=10):", False)])
def test_a_class_is_in_the_reference_format_when_its_init_takes_max_turns(init, reference):
    source = GAME.replace("    def reset(", f"    {init}\n        pass\n\n    def reset(")
    assert structure_of(source).reference is reference


def test_a_reference_game_without_solution_is_recorded_as_such():
    reference = GAME.replace("class TinyEnv:\n", "class TinyEnv:\n    def __init__(self, "
                             "max_turns=10, **kwargs):\n        self.max_turns = max_turns\n\n")
    source = reference.replace("def solution(", "def _solution(")
    assert structure_of(source) == contract.EnvClass("TinyEnv", True, False)
    assert structure_of(GAME) == contract.EnvClass("TinyEnv", False, True)
    ours = GAME.replace("def solution(", "def _solution(")
    assert rejected(structure_of, ours).msg == (
        "class TinyEnv lacks solution: a game defines solution(), the actions that win, so the "
        "oracle can check it is winnable")


def test_a_module_that_rebinds_the_env_class_name_is_a_structure_reject():
    err = rejected(structure_of, GAME + "from random import Random as TinyEnv\n")
    assert err.msg == ("an import rebinds TinyEnv (line 10): an env's classes are what their "
                       "class statements define; put every method in the class body")


# -- a restated ToolUseBaseEnv -------------------------------------------------------------------

DESK = ("class DeskEnv(ToolUseBaseEnv):\n    def setup(self):\n        pass\n"
        "    def solution(self):\n        return ['<answer>done</answer>']\n")


@pytest.mark.parametrize("body", [
    "    pass\n", '    """The base."""\n', "    max_turns = 10\n",
    "    max_turns: int = 10\n    def setup(self):\n        ...\n",
    "    def step(self, action):\n        return None\n",
    "    def step(self, action):\n        return\n",
    "    def setup(self):\n        raise NotImplementedError('define it')\n",
    "    def setup(self):\n        raise NotImplementedError\n",
    "    async def setup(self):\n        pass\n"])
def test_a_restated_base_that_changes_nothing_is_blanked_keeping_line_numbers(body):
    source = "import re\nclass ToolUseBaseEnv:\n" + body + DESK
    out, dropped = contract.drop_restated_base(source)
    assert dropped is True
    lines = out.splitlines()
    assert len(lines) == len(source.splitlines())
    assert lines[1] == "# (ToolUseBaseEnv restated here: dropped, the jail provides it)"
    assert lines[0] == "import re" and all(not line for line in lines[2:2 + body.count("\n")])
    assert out.endswith(DESK)


@pytest.mark.parametrize("body,why", [
    ("    def step(self, action):\n        return 1\n", "its step() has a body of its own (line 3)"),
    ("    def helper(self):\n        pass\n", "its helper() is not a method of the injected one"),
    ("    @staticmethod\n    def setup():\n        pass\n",
     "its setup() has a body of its own (line 4)"),
    ("    def setup(self):\n        raise ValueError('x')\n",
     "its setup() has a body of its own (line 3)"),
    ("    def setup(self):\n        return 0\n", "its setup() has a body of its own (line 3)"),
    ("    def setup(self):\n        raise\n", "its setup() has a body of its own (line 3)"),
    ("    colour = 'red'\n", "it sets an attribute the injected one does not (line 3)"),
    ("    max_turns = len('abc')\n", "it sets an attribute the injected one does not (line 3)"),
    ("    self.x = 1\n", "it sets an attribute the injected one does not (line 3)"),
    ("    print('hi')\n", "its body runs code (line 3)")])
def test_a_restated_base_with_code_of_its_own_is_rejected_saying_what(body, why):
    source = "import re\nclass ToolUseBaseEnv:\n" + body + DESK
    err = rejected(contract.drop_restated_base, source)
    assert err.check == "structure"
    assert err.msg == (f"line 2: the module defines its own ToolUseBaseEnv, and {why}; the jail "
                       "provides the base class: remove the class and keep only your *Env "
                       "subclass")


@pytest.mark.parametrize("head", ["class ToolUseBaseEnv(object):", "@dataclass\nclass "
                                  "ToolUseBaseEnv:", "class ToolUseBaseEnv(metaclass=type):"])
def test_a_restated_base_with_bases_keywords_or_decorators_is_rejected(head):
    err = rejected(contract.drop_restated_base, f"{head}\n    pass\n" + DESK)
    assert "it has bases, keywords or decorators of its own" in err.msg


def test_a_base_restated_twice_is_rejected_and_a_module_without_one_is_kept():
    twice = "class ToolUseBaseEnv:\n    pass\nclass ToolUseBaseEnv:\n    pass\n" + DESK
    assert rejected(contract.drop_restated_base, twice).msg == (
        "ToolUseBaseEnv is defined 2 times; the jail provides it: remove every definition")
    assert contract.drop_restated_base(DESK) == (DESK, False)
    assert contract.drop_restated_base("def f(:\n") == ("def f(:\n", False)


# -- replies and steps ---------------------------------------------------------------------------

def step_reply(reward=0.0, shape=("tuple", 5)):
    return Reply("ok", result=["obs", reward, False, False, {}], shape=list(shape))


@pytest.mark.parametrize("reward,bound,ok", [(1.0, 1.0, True), (-1.0, 1.0, True),
                                             (1.0001, 1.0, False), (-1.0001, 1.0, False),
                                             (10.0, 10.0, True), (10.5, 10.0, False)])
def test_a_step_reward_is_within_its_bound_inclusive(reward, bound, ok):
    problem = contract.step_problem(step_reply(reward), bound)
    if ok:
        assert problem is None
    else:
        assert problem == f"reward {reward} is outside [-{bound:g}, {bound:g}]"


def test_a_step_of_the_wrong_shape_names_what_it_returned():
    assert contract.step_problem(step_reply(shape=("tuple", 4))) == (
        "must return a 5-tuple (obs, reward, terminated, truncated, info), got tuple of length 4")
    assert contract.step_problem(Reply("ok", result="x", shape=["str", None])).endswith("got str")
    assert contract.describe(Reply("ok")) == "?"
    assert contract.step_problem(step_reply()) is None


def test_a_long_action_is_shortened_to_forty_characters_in_messages():
    assert contract.short("a" * 40) == repr("a" * 40)
    assert contract.short("a" * 41) == repr("a" * 37 + "...")


class Worker:
    """In-process stand-in for a jailed worker: `replies[op]` is a Reply or a list of them."""

    def __init__(self, **replies):
        self.replies, self.calls = replies, []

    def call(self, op, **fields):
        self.calls.append((op, fields))
        reply = self.replies[op]
        if isinstance(reply, list):
            return reply.pop(0) if len(reply) > 1 else reply[0]
        return reply


def probe(**replies):
    return Probe(Worker(**replies))


@pytest.mark.parametrize("outcome", ["timeout", "oom", "output_limit"])
def test_a_resource_outcome_in_any_check_is_a_resources_reject(outcome):
    p = probe(step=Reply(outcome, error={"msg": "too slow"}))
    p.check = "garbage"
    err = rejected(p.call, "step")
    assert (err.check, err.outcome) == ("resources", outcome)
    assert err.msg == f"{outcome} during garbage (step): too slow"
    assert rejected(probe(step=Reply(outcome)).call, "step").msg == f"{outcome} during load (step): "


def test_a_refused_operation_is_a_policy_reject_naming_it():
    p = probe(reset=Reply("program_error", error={"type": "RefusedOperation",
                                                  "msg": "os.fork (a new process)"}))
    p.check = "reset"
    err = rejected(p.call, "reset")
    assert (err.check, err.outcome) == ("policy", "program_error")
    assert err.msg == "during reset (reset), the env tried os.fork (a new process)"


def test_a_bad_reply_is_a_step_types_reject_for_a_step_and_the_checks_own_otherwise():
    bad = Reply("program_error", error={"type": "bad_reply", "msg": "step: reward is a str"})
    p = probe(step=bad, reset=bad)
    p.check = "determinism"
    assert (rejected(p.call, "step").check, rejected(p.call, "step").msg) == (
        "step_types", "step: reward is a str")
    assert rejected(p.call, "reset").check == "determinism"


def test_an_env_error_is_the_running_checks_reject_naming_the_op_and_exception():
    p = probe(reset=Reply("program_error", error={"type": "KeyError", "msg": "'x'"}))
    p.check = "reset"
    err = rejected(p.call, "reset")
    assert (err.check, err.msg, err.outcome) == ("reset", "reset raised KeyError: 'x'",
                                                 "program_error")
    assert rejected(probe(load=Reply("import_error")).call, "load").msg == "load raised None:"


def test_a_jail_that_fails_stops_everything():
    with pytest.raises(SandboxUnavailable, match="^no nsjail$"):
        probe(load=Reply("sandbox_failure", error={"msg": "no nsjail"})).call("load")
    with pytest.raises(SandboxUnavailable, match="^sandbox failure$"):
        probe(load=Reply("sandbox_failure")).call("load")


def test_a_reset_must_give_a_non_empty_observation_and_an_info():
    p = probe(reset=Reply("ok", result=["  \n", {}], shape=["tuple", 2]))
    p.check = "reset"
    assert rejected(p.reset, 7).msg == "reset(seed=7) returned an empty observation"
    p = probe(reset=Reply("ok", result=["a", {}, 1], shape=["tuple", 3]))
    assert rejected(p.reset, 7).msg == "reset(seed=7) must return (str, dict), got tuple of length 3"
    assert probe(reset=Reply("ok", result=["a", {}], shape=["tuple", 2])).reset(1) == ["a", {}]


def test_a_step_past_the_reward_bound_is_a_step_types_reject_naming_the_action():
    p = Probe(Worker(step=step_reply(2.0)), reward_bound=1.0)
    err = rejected(p.step, "\\boxed{go}")
    assert err.check == "step_types"
    assert err.msg == "step('\\\\boxed{go}') reward 2.0 is outside [-1, 1]"
    assert Probe(Worker(step=step_reply(2.0)), reward_bound=10.0).step("x")[1] == 2.0


# -- load: max_turns -----------------------------------------------------------------------------

@pytest.mark.parametrize("max_turns,facts", [(None, MAX_TURNS_CAP), (1, 1), (25, 25), (26, 25),
                                             (1000, 25)])
def test_max_turns_defaults_to_and_is_capped_at_25(max_turns, facts):
    info = {"class_name": "TinyEnv", "domain": "game"}
    if max_turns is not None:
        info["max_turns"] = max_turns
    p = probe(load=Reply("ok", result=info))
    assert contract.load(p, "src") == EnvFacts("TinyEnv", "game", facts)
    assert p.worker.calls == [("load", {"source": "src"})] and p.check == "load"


@pytest.mark.parametrize("max_turns", [0, -1, True, False, 2.5, "5"])
def test_max_turns_must_be_a_positive_int(max_turns):
    p = probe(load=Reply("ok", result={"class_name": "A", "domain": "game",
                                       "max_turns": max_turns}))
    err = rejected(contract.load, p, "src")
    assert err.check == "load" and err.msg == f"max_turns must be a positive int, got {max_turns!r}"


# -- solution() ----------------------------------------------------------------------------------

@pytest.mark.parametrize("result,actions", [
    (["\\boxed{1}", "\\boxed{2}"], ["\\boxed{1}", "\\boxed{2}"]),
    ("  42 \n", ["\\boxed{42}"]), (7, ["\\boxed{7}"]), (2.5, ["\\boxed{2.5}"]),
    ("\\boxed{a}\n\n\\boxed{b}\n", ["\\boxed{a}", "\\boxed{b}"]),
    ("<tool_call>{}</tool_call>\n<answer>done</answer>",
     ["<tool_call>{}</tool_call>", "<answer>done</answer>"])])
def test_solution_results_become_actions(result, actions):
    assert contract.solution_actions(probe(solution=Reply("ok", result=result)), 3) == actions


@pytest.mark.parametrize("result,shape", [([], ["list", 0]), (["a", 1], ["list", 2]),
                                          (True, ["bool", None]),
                                          ({"a": 1}, ["dict", 1]), (None, ["NoneType", None])])
def test_a_solution_that_is_no_list_of_actions_fails_the_oracle(result, shape):
    p = probe(solution=Reply("ok", result=result, shape=shape))
    err = rejected(contract.solution_actions, p, 4)
    kind, size = shape
    got = f"{kind} of length {size}" if size is not None else kind
    assert (err.check, err.msg) == ("oracle", "solution() for seed 4 must return a non-empty "
                                              f"list of action strings, got {got}")


def test_seeds_are_drawn_in_order_until_none_is_left():
    seeds = Seeds([1, 2], [3, 4])
    assert (seeds.draw(), seeds.draw(), seeds.draw()) == (3, 4, None)
    assert seeds.used == [1, 2, 3, 4] and seeds.spare == []
    assert Seeds([5]).spare == [] and Seeds([5]).draw() is None


# -- the majority rule of `trivial` --------------------------------------------------------------

def counted(results):
    played = []

    def episode(i):
        def run():
            played.append(i)
            return results[i]
        return run

    return [episode(i) for i in range(len(results))], played


@pytest.mark.parametrize("results,tally,plays", [
    ([True, True, False, False], None, 4),  # half is not most
    ([True, True, True, False], "3 of 3", 3),  # decided after three wins of four
    ([False, False, True, True], None, 2),  # two losses of four: most cannot win any more
    ([True, False, True], "2 of 3", 3), ([True, True, False], "2 of 2", 2),
    ([True], "1 of 1", 1), ([False], None, 1), ([], None, 0)])
def test_trivial_fails_an_env_only_when_most_episodes_are_won(results, tally, plays):
    episodes, played = counted(results)
    assert contract.wins_most(episodes) == tally
    assert len(played) == plays


# -- the reset gate ------------------------------------------------------------------------------

def gate(*status):
    return probe(reset=Reply("ok", result=["obs", {}], shape=["tuple", 2]),
                 criteria=[Reply("ok", result=s) for s in status])


def test_the_reset_gate_passes_when_no_criterion_holds_on_any_seed():
    p = gate([False, False], [False])
    contract.check_reset_gate(p, [1, 2])
    assert [op for op, _ in p.worker.calls] == ["reset", "criteria", "reset", "criteria"]
    assert p.check == "reset_gate"


def test_a_criterion_that_holds_at_reset_fails_the_gate_naming_it_and_the_seed():
    err = rejected(contract.check_reset_gate, gate([False], [False, True]), [5, 6])
    assert (err.check, err.msg) == ("reset_gate", "criterion 2 already holds at reset (seed 6)")
    err = rejected(contract.check_reset_gate, gate(True), [5])
    assert err.msg == "criterion 1 already holds at reset (seed 5)"


def test_a_criterion_that_raises_at_reset_fails_the_gate_with_its_error():
    err = rejected(contract.check_reset_gate, gate([False, "ValueError: x"]), [9])
    assert err.msg == "criterion 2 raises at reset (seed 9): ValueError: x"
    assert rejected(contract.check_reset_gate, gate([1]), [9]).msg.startswith(
        "criterion 1 raises at reset (seed 9)")  # 1 is not True: not a verdict


# -- global random -------------------------------------------------------------------------------

@pytest.mark.parametrize("body,found", [
    ("import random\n", None),
    ("import random\n", "reset:random.randint"),
    ("import random as r\n", "reset:r.choice"),
    ("from random import randint\n", "reset:randint"),
    ("import random\n", "seeded"),
])
def test_a_reset_drawing_from_the_global_random_module_is_named(body, found):
    calls = {None: "x = 1", "reset:random.randint": "x = random.randint(1, 6)",
             "reset:r.choice": "x = r.choice('ab')", "reset:randint": "x = randint(1, 6)",
             "seeded": "random.seed(seed); x = random.randint(1, 6)"}[found]
    source = body + GAME.replace('        return "hi", {}', f"        {calls}\n        return "
                                 '"hi", {}')
    why = contract.global_random_use(ast.parse(source))
    if found in (None, "seeded"):
        assert why is None
    else:
        method, call = found.split(":")
        assert why == (f"{method}() draws from the global random module (line 4: {call}), not "
                       "self.rng or random.Random(seed): the same seed gives each worker another "
                       "episode, so solution(), computed in another worker, does not fit it; draw "
                       "from self.rng")


def test_global_random_in_a_helper_that_reset_calls_is_found():
    source = ("import random\nclass TinyEnv:\n    def reset(self, seed=None):\n"
              "        self._deal()\n        return 'hi', {}\n    def _deal(self):\n"
              "        self.x = random.random()\n    def step(self, action):\n"
              "        return 'ok', 0.0, False, False, {}\n")
    assert contract.global_random_use(ast.parse(source)).startswith(
        "_deal() draws from the global random module (line 7: random.random)")
    own = source.replace("random.random()", "random.Random(1).random()")
    assert contract.global_random_use(ast.parse(own)) is None


# -- more of the messages and verdicts above ------------------------------------------------------

def test_extract_keeps_the_blocks_own_spaces_and_letters_at_its_edges():
    assert extract("```python\n  \nX = 1  \n```") == "  \nX = 1  \n"
    assert extract("```python\nX = 1\nY = X\n```") == "X = 1\nY = X\n"


def test_a_multibyte_source_at_the_cap_in_characters_is_over_it_in_bytes():
    err = rejected(check_size, "é" * MAX_SOURCE_BYTES)
    assert err.msg.startswith(f"the env's source is {2 * MAX_SOURCE_BYTES} bytes")
    err = rejected(check_size, "é" * (MAX_SOURCE_BYTES + 1))
    assert err.msg.startswith(f"the env's source is {MAX_SOURCE_BYTES + 1} bytes")


@pytest.mark.parametrize("source", ["x = " + "-" * 100_000 + "1\n",
                                    "x = " + " + ".join(["1"] * 5000) + "\n"])
def test_nesting_too_deep_names_the_error_exactly(source):
    """Which of the two the parser raises depends on the process (its C stack and the memory
    already in use: a lone run and a whole suite differ), so the message names it. Python's
    default recursion limit, whatever an earlier test or library set."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        err = rejected(parse, source)
    finally:
        sys.setrecursionlimit(limit)
    assert err.msg.startswith("the source nests too deeply for Python's parser (")
    assert err.msg.endswith("); write long expressions as loops or data")
    named = err.msg.split("(", 1)[1]
    assert named.startswith(("MemoryError)", "RecursionError: maximum recursion depth"))


def test_a_parser_that_refuses_null_bytes_with_a_value_error_still_gives_a_parse_reject(
        monkeypatch):
    """Interpreters from before a null byte became a SyntaxError (3.11.7 has the change) raise
    ValueError."""
    def refuse(source):
        raise ValueError("source code string cannot contain null bytes")

    monkeypatch.setattr(ast, "parse", refuse)
    err = rejected(parse, "x = 1\0\n")
    assert (err.check, err.msg) == ("parse", "source code string cannot contain null bytes")


def test_a_tree_too_deep_to_walk_is_a_parse_reject_not_a_crash(monkeypatch):
    def too_deep(tree):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(contract, "structure", too_deep)
    err = rejected(static_checks, GAME, True)
    assert (err.check, err.msg) == ("parse", "the source nests too deeply to check "
                                    "(RecursionError); write long expressions as loops or data")


@pytest.mark.parametrize("source", ["x = 1\n", GAME + GAME.replace("TinyEnv", "OtherEnv")])
def test_a_module_without_exactly_one_env_class_is_a_structure_reject(source):
    from sandbox import env_class
    with pytest.raises(env_class.EnvClassError) as expected:
        env_class.env_class(ast.parse(source))
    err = rejected(structure_of, source)
    assert (err.check, err.msg) == ("structure", str(expected.value))


def test_a_game_inherits_only_from_object_or_classes_written_in_its_module():
    assert structure_of(GAME.replace("class TinyEnv:", "class TinyEnv(object):")).name == "TinyEnv"
    own_base = "class _Board:\n    size = 3\n\n\n" + GAME.replace("class TinyEnv:",
                                                              "class TinyEnv(_Board):")
    assert structure_of(own_base).name == "TinyEnv"
    import_base = "import abc\n" + GAME.replace("class TinyEnv:", "class TinyEnv(abc.ABC):")
    assert "inherits from abc.ABC" in rejected(structure_of, import_base).msg
    assert rejected(structure_of, "class TinyEnv:\n    x = 1\n").check == "structure"


def test_a_tool_use_env_redefining_a_base_method_is_told_its_line_and_what_to_define():
    source = ("class DeskEnv(ToolUseBaseEnv):\n    def setup(self):\n        pass\n"
              "    def solution(self):\n        return []\n\n    def _reply(self):\n"
              "        return 1\n")
    err = rejected(structure_of, source)
    assert err.msg == ("line 7: class DeskEnv redefines ToolUseBaseEnv._reply; a tool-use env "
                       "defines setup, solution, max_turns, tool_<name> methods and its own "
                       "helpers, never the base class's internals")


@pytest.mark.parametrize("body", [
    '    def step(self, action):\n        """doc"""\n        return 1\n',
    "    def step(self, action):\n        pass\n        return 1\n",
    "    def step(self, action):\n        return None\n        x = 1\n",
    "    def step(self, action):\n        raise NotImplementedError\n        x = 1\n"])
def test_a_restated_method_that_does_something_after_a_stub_line_is_rejected(body):
    err = rejected(contract.drop_restated_base, "class ToolUseBaseEnv:\n" + body + DESK)
    assert "its step() has a body of its own (line 2)" in err.msg


@pytest.mark.parametrize("first", ['    """The base."""\n', "    pass\n",
                                   "    def setup(self):\n        pass\n", "    max_turns = 5\n"])
def test_every_item_of_a_restated_base_is_checked_after_harmless_ones(first):
    source = "class ToolUseBaseEnv:\n" + first + "    print('hi')\n" + DESK
    assert "its body runs code" in rejected(contract.drop_restated_base, source).msg


def test_a_restated_base_may_set_any_attribute_of_the_base_to_a_constant():
    out, dropped = contract.drop_restated_base("class ToolUseBaseEnv:\n    setup = None\n" + DESK)
    assert dropped is True
    every = " = ".join(sorted(vars(contract.tool_base.ToolUseBaseEnv)))  # all in one assignment
    assert contract.drop_restated_base(f"class ToolUseBaseEnv:\n    {every} = 0\n" + DESK)[1]


def test_the_restated_base_rejects_are_structure_rejects_with_their_reason():
    twice = "class ToolUseBaseEnv:\n    pass\nclass ToolUseBaseEnv:\n    pass\n" + DESK
    assert rejected(contract.drop_restated_base, twice).check == "structure"
    err = rejected(contract.drop_restated_base, "class ToolUseBaseEnv(object):\n    pass\n" + DESK)
    assert err.msg == ("line 1: the module defines its own ToolUseBaseEnv, and it has bases, "
                       "keywords or decorators of its own; the jail provides the base class: "
                       "remove the class and keep only your *Env subclass")


def test_probe_sends_the_seed_and_the_action_and_names_its_check():
    p = probe(reset=Reply("ok", result=["a", {}], shape=["tuple", 2]), step=step_reply())
    p.reset(7)
    p.step("\\boxed{x}")
    assert p.worker.calls == [("reset", {"seed": 7}), ("step", {"action": "\\boxed{x}"})]
    p = probe(reset=Reply("ok", result=[" ", {}], shape=["tuple", 2]))
    p.check = "determinism"
    assert rejected(p.reset, 1).check == "determinism"
    p = probe(reset=Reply("ok", result=["a"], shape=["tuple", 1]))
    p.check = "garbage"
    assert rejected(p.reset, 1).check == "garbage"


def test_a_refusal_without_a_message_and_a_bad_reply_keep_their_outcome():
    err = rejected(probe(step=Reply("program_error", error={"type": "RefusedOperation"})).call,
                   "step")
    assert err.msg == "during load (step), the env tried "
    bad = Reply("program_error", error={"type": "bad_reply", "msg": "m"})
    assert rejected(probe(step=bad).call, "step").outcome == "program_error"


def test_the_reset_gate_resets_each_seed_and_its_rejects_are_reset_gate_rejects():
    p = gate([False], [False])
    contract.check_reset_gate(p, [3, 4])
    assert [f for op, f in p.worker.calls if op == "reset"] == [{"seed": 3}, {"seed": 4}]
    assert rejected(contract.check_reset_gate, gate(["boom"]), [1]).check == "reset_gate"


def random_use(source):
    return contract.global_random_use(ast.parse(textwrap.dedent(source)))


STEP = "    def step(self, action):\n        return 'ok', 0.0, False, False, {}\n"


def test_global_random_is_found_whatever_else_is_imported():
    assert random_use("import random\nimport os\nclass TinyEnv:\n    def reset(self, seed=None):"
                      "\n        return random.random(), {}\n" + STEP).startswith("reset()")
    assert random_use("from random import randint\nfrom random import Random\nclass TinyEnv:\n"
                      "    def reset(self, seed=None):\n        return randint(1, 2), {}\n"
                      + STEP).startswith("reset()")


def test_an_own_random_generator_imported_by_name_is_fine():
    assert random_use("from random import Random, SystemRandom\nclass TinyEnv:\n"
                      "    def reset(self, seed=None):\n        self.rng = Random(seed)\n"
                      "        SystemRandom()\n        return 'a', {}\n" + STEP) is None


def test_a_tool_use_setup_drawing_from_global_random_is_found():
    source = ("import random\nclass DeskEnv(ToolUseBaseEnv):\n    def setup(self):\n"
              "        self.x = random.random()\n    def solution(self):\n        return []\n")
    assert random_use(source).startswith("setup() draws from the global random module (line 4")


def test_helpers_called_twice_or_recursively_are_scanned_once_and_the_rest_still_are():
    source = ("import random\nclass TinyEnv:\n    def reset(self, seed=None):\n"
              "        self._a(); self._a(); self._b()\n        return 'a', {}\n"
              "    def _a(self):\n        return self._a()\n"
              "    def _b(self):\n        return random.random()\n" + STEP)
    assert random_use(source).startswith("_b() draws from the global random module (line 9")


def test_a_module_function_named_like_a_method_is_still_the_modules():
    source = ("import random\nclass TinyEnv:\n    def reset(self, seed=None):\n"
              "        return random.choice('ab'), {}\n    def choice(self):\n        return 1\n"
              + STEP)
    assert random_use(source).startswith("reset() draws from the global random module (line 4")


# -- the mended \boxed escape --------------------------------------------------------------------

def test_an_ordinary_boxed_literal_is_mended_and_nothing_else_is():
    source = ('a = "\\boxed{open 3}"\n'          # a backspace: mended
              'b = r"\\boxed{x}"\n'               # raw: a backslash already
              'c = "\\\\boxed{ok}"\n'             # escaped: a backslash already
              'd = f"\\boxed{{{n}}}"\n'           # an f-string (3.11 reads it as one token)
              'e = """two\nlines \\boxed{y}"""\n'
              'f = "\\frac{1}{2}"  # \\boxed in a comment\n')
    mended, count = contract.repair_boxed_escapes(source)
    assert count == 3
    values = {}
    exec(mended, {"n": 1}, values)
    assert values["a"] == "\\boxed{open 3}" and values["d"] == "\\boxed{1}"
    assert values["b"] == "\\boxed{x}" and values["c"] == "\\boxed{ok}"
    assert values["e"] == "two\nlines \\boxed{y}"
    assert values["f"] == "\x0crac{1}{2}"  # other escapes are the oracle's to name
    assert mended.count("\n") == source.count("\n")  # line numbers hold
    assert mended.endswith("# \\boxed in a comment\n")
    unclosed = 'x = """never closed \\boxed\n'
    assert contract.repair_boxed_escapes(unclosed) == (unclosed, 0)


# -- the runtime checks on an env played in-process -----------------------------------------------
# GuessEnv (tests/sandbox/env_worker.py) wins with the seed's digit in a box; each test breaks
# one thing about it and asks the check that must notice.

def on(env, domain="game", bound=contract.REWARD_BOUND):
    return Probe(EnvWorker(env, domain), bound)


def facts(max_turns=3, domain="game", oracle=True):
    return EnvFacts("GuessEnv", domain, max_turns, oracle=oracle)


def solved(seeds, env_class=GuessEnv):
    """What the solution worker records for each seed, from an env of its own."""
    env = env_class()
    return {seed: contract.Solved(list(env.reset(seed)), env.solution()) for seed in seeds}


class OpenEndedEnv(GuessEnv):
    """A right guess pays but leaves the episode open, and every later step tells how many
    episodes this instance has played: two replays differ only after the solution."""

    episodes = 0

    def reset(self, seed=None):
        self.episodes += 1
        return super().reset(seed)

    def step(self, action):
        obs, reward, _, truncated, info = super().step(action)
        return (obs if self.turns == 1 else f"episode {self.episodes}"), reward, False, \
            truncated, info


def test_the_determinism_replay_plays_one_step_past_the_solution():
    """An env that differs only after the solution is caught, by the probe step."""
    p = on(OpenEndedEnv())
    err = rejected(contract.check_determinism, p, 3, solved([3])[3], facts())
    assert (err.check, err.msg) == ("determinism",
                                    "same seed and actions gave different results at step 2")
    assert p.worker.played("reset") == [3, 3]
    assert p.worker.played("step") == ["\\boxed{3}", contract.PROBE_ACTION] * 2


def test_the_determinism_replay_stops_where_the_episode_ends():
    p = on(GuessEnv())
    contract.check_determinism(p, 4, solved([4])[4], facts())
    assert p.worker.played("step") == ["\\boxed{4}", "\\boxed{4}"]  # terminated: no probe step
    truncating = type("TruncatingEnv", (GuessEnv,), {"max_turns": 1})
    p = on(truncating())
    contract.check_determinism(p, 4, contract.Solved(["Guess my digit (4).", {}], ["\\boxed{9}"]),
                               facts())
    assert p.worker.played("step") == ["\\boxed{9}", "\\boxed{9}"]  # truncated: no probe step
    p = on(GuessEnv())
    contract.check_determinism(p, 4, contract.Solved(["Guess my digit (4).", {}],
                                                     ["\\boxed{9}", "\\boxed{4}"]), facts())
    assert p.worker.played("step") == ["\\boxed{9}", "\\boxed{4}"] * 2  # ended at its second
    p = on(type("TwoTurnEnv", (GuessEnv,), {"max_turns": 2})())
    contract.check_determinism(p, 4, contract.Solved(["Guess my digit (4).", {}],
                                                     ["\\boxed{9}", "\\boxed{8}"]), facts())
    assert p.worker.played("step") == ["\\boxed{9}", "\\boxed{8}"] * 2  # truncated at its second


class CountingResetEnv(GuessEnv):
    """Its first observation counts the episodes this instance has played."""

    episodes = 0

    def reset(self, seed=None):
        super().reset(seed)
        self.episodes += 1
        return f"episode {self.episodes}", {}


def test_a_first_observation_unlike_the_solution_workers_is_not_deterministic():
    err = rejected(contract.check_determinism, on(GuessEnv()), 3,
                   contract.Solved(["Guess my digit (4).", {}], ["\\boxed{3}"]), facts())
    assert (err.check, err.msg) == ("determinism", "reset(seed=3) gave different results in two "
                                                   "workers")
    err = rejected(contract.check_determinism, on(GuessEnv()), 3,
                   contract.Solved(["other", {}], ["\\boxed{3}"]), facts(), "it draws globally")
    assert err.msg == "reset(seed=3) gave different results in two workers: it draws globally"


def test_a_reset_that_differs_on_the_second_replay_is_named_as_the_reset():
    first = contract.Solved(["episode 1", {}], ["\\boxed{3}"])
    err = rejected(contract.check_determinism, on(CountingResetEnv()), 3, first, facts())
    assert err.msg == "same seed and actions gave different results at reset(seed=3)"
    err = rejected(contract.check_determinism, on(OpenEndedEnv()), 3, solved([3])[3], facts(),
                   "why")
    assert err.msg == "same seed and actions gave different results at step 2: why"


class EndlessEnv(GuessEnv):
    """Never ends an episode: a wrong guess is "no" forever."""

    def step(self, action):
        self.turns += 1
        return "no", 0.0, False, False, {}


def test_an_env_that_raises_during_the_replay_is_a_determinism_reject():
    class RaisesPastTheSolution(OpenEndedEnv):
        def step(self, action):
            if action == contract.PROBE_ACTION:
                raise IndexError("no more turns")
            return super().step(action)

    err = rejected(contract.check_determinism, on(RaisesPastTheSolution()), 3, solved([3])[3],
                   facts())
    assert (err.check, err.msg) == ("determinism", "step raised IndexError: no more turns")


def test_an_env_without_solution_replays_generic_actions_for_its_turns_and_the_probe_step():
    p = on(EndlessEnv())
    contract.check_determinism(p, 7, contract.Solved(["Guess my digit (7).", {}], None),
                               facts(max_turns=2, oracle=False))
    once = ["\\boxed{}", "\\boxed{0}", contract.PROBE_ACTION]
    assert p.worker.played("step") == once * 2


def test_generic_actions_cycle_through_the_list_for_any_number_of_turns():
    n = len(contract.GENERIC_ACTIONS)
    assert contract.generic_actions(n + 2) == [*contract.GENERIC_ACTIONS,
                                               *contract.GENERIC_ACTIONS[:2]]
    assert contract.generic_actions(1) == ["\\boxed{}"]


class ZeroPayEnv(GuessEnv):
    """The right guess ends the episode, paying 0."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, 0.0, terminated, truncated, info


def test_a_terminal_reward_of_0_is_not_a_win_for_the_oracle():
    err = rejected(contract.check_oracle, on(ZeroPayEnv()), facts(), solved([3]))
    assert (err.check, err.msg) == ("oracle", "replaying solution() for seed 3 did not win "
                                              "(terminated=True, reward=0.0)")
    assert contract.won((True, 0.0)) is False and contract.won((True, 0.5)) is True
    assert contract.won((False, 1.0)) is False


def test_a_solution_that_pays_but_leaves_the_episode_open_is_not_a_win():
    err = rejected(contract.check_oracle, on(OpenEndedEnv()), facts(), solved([3]))
    assert err.msg == "replaying solution() for seed 3 did not win (terminated=False, reward=1.0)"


def test_the_oracle_replays_every_seeds_solution_and_names_the_one_that_loses():
    class LosesOnFive(GuessEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, (-1.0 if self.answer == 5 else reward), terminated, truncated, info

    p = on(LosesOnFive())
    contract.check_oracle(on(GuessEnv()), facts(), solved([3, 4]))
    err = rejected(contract.check_oracle, p, facts(), solved([3, 5, 4]))
    assert err.msg == "replaying solution() for seed 5 did not win (terminated=True, reward=-1.0)"
    assert p.worker.played("reset") == [3, 5] and p.check == "oracle"


def test_a_solution_of_max_turns_actions_is_played_and_one_more_is_refused():
    class LastTurnEnv(GuessEnv):  # the answer counts only on the last of its three turns
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, terminated and self.turns == 3, truncated, info

    p = on(LastTurnEnv())
    contract.check_oracle(p, facts(), {3: contract.Solved(["x", {}], ["\\boxed{3}"] * 3)})
    assert len(p.worker.played("step")) == 3
    err = rejected(contract.check_oracle, on(LastTurnEnv()), facts(),
                   {3: contract.Solved(["x", {}], ["\\boxed{3}"] * 4)})
    assert (err.check, err.msg) == ("oracle", "solution for seed 3 has 4 actions, more than "
                                              "max_turns=3: set max_turns to at least 4, or "
                                              "solve in fewer actions")
    err = rejected(contract.check_oracle, on(LastTurnEnv()), facts(max_turns=25),
                   {3: contract.Solved(["x", {}], ["\\boxed{3}"] * 26)})
    assert err.msg.endswith("more than max_turns=25: solve in fewer actions (max_turns is at "
                            "most 25)")


def test_a_lost_oracle_says_the_env_draws_from_the_global_random_module():
    err = rejected(contract.check_oracle, on(ZeroPayEnv()), facts(), solved([3]), "global draws")
    assert err.msg.endswith("(terminated=True, reward=0.0): global draws")


class DeskEnv(GuessEnv):
    """A tool-use env as the worker plays it: done after the seed's digit as the answer pays
    `pay` when every criterion holds; the criteria are `status` once a step was taken, and
    none holds at reset."""

    max_turns = 3
    status = [True, True]
    pay = 1.0

    def reset(self, seed=None):
        self.answered = False
        return super().reset(seed)

    def criteria(self):
        return self.status if self.turns else [False] * len(self.status)

    def step(self, action):
        self.turns += 1
        self.answered |= action == f"<answer>{self.answer}</answer>"
        if action.lower().replace(" ", "") == "<answer>done</answer>":
            paid = self.answered and all(v is True for v in self.status)
            return "done", self.pay * paid, True, False, {}
        return "ok", 0.0, False, False, {}

    def solution(self):
        return [f"<answer>{self.answer}</answer>", "<answer>done</answer>"]

    def tools(self):
        return [{"name": "look"}]


def desk(**attributes):
    return on(type("Desk", (DeskEnv,), attributes)(), "tool_use")


@pytest.mark.parametrize("status,actions,why", [
    ([True, "ValueError: x"], ["<answer>done</answer>"],
     "criterion 2 raises after the solution's actions (ValueError: x); a criterion that raises "
     "counts as not met, so its request never completes: make it return False instead"),
    ([True, True, False], ["<answer>3</answer>"], "2 of 3 criteria hold after its actions"),
    ([True, False], ["<ANSWER> Done </answer>"], "1 of 2 criteria hold after its actions"),
    ([False, False, True], ["<answer>done</answer>"], "1 of 3 criteria hold after its actions"),
])
def test_a_lost_tool_use_oracle_says_which_criteria_do_not_hold(status, actions, why):
    err = rejected(contract.check_oracle, desk(status=status), facts(domain="tool_use"),
                   {3: contract.Solved(["x", {}], actions)})
    ended = actions != ["<answer>3</answer>"]
    assert err.msg == ("replaying solution() for seed 3 did not win "
                       f"(terminated={ended}, reward=0.0): {why}")


CALL = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'


@pytest.mark.parametrize("actions,appended", [
    ([CALL], True),
    ([CALL, "<answer>done</answer>"], False),
    ([CALL, "<answer> Done </answer>"], False),  # what step accepts as done
    ([CALL, "<ANSWER>done</ANSWER>"], True),  # what it does not
    ([CALL, "<answer>3</answer>"], True),  # an answer, but not the one that ends the episode
    ([CALL + "<answer>done</answer>"], True),  # step runs the call, not the answer beside it
    (["<answer>done</answer>", CALL], True),
])
def test_a_tool_use_solution_is_replayed_ending_with_finish(actions, appended):
    assert contract.finished(actions) == actions + ["<answer>done</answer>"] * appended


@pytest.mark.parametrize("status", [[True, True], [], "not a list"])
def test_a_tool_use_oracle_that_cannot_tell_why_says_only_that_it_lost(status):
    err = rejected(contract.check_oracle, desk(status=status, pay=0.0), facts(domain="tool_use"),
                   {3: contract.Solved(["x", {}], ["<answer>3</answer>", "<answer>done</answer>"])})
    assert err.msg == "replaying solution() for seed 3 did not win (terminated=True, reward=0.0)"


def test_the_oracle_reads_no_criteria_of_a_game_or_a_reference_tool_use_env():
    p = desk(status=[False])
    lost = {3: contract.Solved(["x", {}], ["<answer>done</answer>"])}
    assert rejected(contract.check_oracle, p, facts(domain="tool_use"), lost,
                    None, False).msg.endswith("(terminated=True, reward=0.0)")
    p = on(type("Desk", (DeskEnv,), {"status": [False]})())  # a game that has criteria()
    assert rejected(contract.check_oracle, p, facts(), lost).msg.endswith("reward=0.0)")
    assert "criteria" not in [op for op, _ in p.worker.calls]


def test_criteria_that_cannot_be_read_after_a_lost_replay_leave_only_the_loss():
    def broken(self):
        raise TypeError("setup() must set self.criteria to a list of functions")

    err = rejected(contract.check_oracle, desk(status=[False], criteria=broken),
                   facts(domain="tool_use"),
                   {3: contract.Solved(["x", {}], ["<answer>done</answer>"])})
    assert err.msg == ("replaying solution() for seed 3 did not win (terminated=True, reward=0.0)")


def test_play_ends_at_termination_or_truncation_and_gives_the_last_reward():
    p = on(GuessEnv())
    assert contract.play(p, 3, contract.replay(["\\boxed{9}", "\\boxed{3}"]), 2) == (True, 1.0)
    assert contract.play(p, 3, lambda turn: "\\boxed{9}", 10) == (False, 0.0)
    assert p.worker.played("step") == ["\\boxed{9}", "\\boxed{3}"] + ["\\boxed{9}"] * 3
    assert p.worker.played("reset") == [3, 3]


class EndsEveryStepEnv(GuessEnv):
    """Every step ends the episode (ended by termination, or truncation when `truncate`); a
    step after the end raises, as a finished env may."""

    truncate = False

    def reset(self, seed=None):
        self.over = False
        return super().reset(seed)

    def step(self, action):
        if self.over:
            raise RuntimeError("stepped after the end")
        self.over = True
        return "over", 0.0, not self.truncate, self.truncate, {}


@pytest.mark.parametrize("truncate", [False, True])
def test_garbage_starts_a_new_episode_whenever_one_ends(truncate):
    env = EndsEveryStepEnv()
    env.truncate = truncate
    p = on(env)
    contract.check_garbage(p, 6)
    assert p.worker.played("step") == list(contract.GARBAGE_ACTIONS)
    assert p.worker.played("reset") == [6] * (1 + len(contract.GARBAGE_ACTIONS))


def test_garbage_is_played_in_one_episode_while_it_lasts():
    p = on(EndlessEnv())
    contract.check_garbage(p, 6)
    assert p.worker.played("reset") == [6]
    assert p.worker.played("step") == list(contract.GARBAGE_ACTIONS)


def test_garbage_that_breaks_the_step_contract_or_raises_is_rejected_naming_the_action():
    class PaysTwoForEmpty(EndlessEnv):
        def step(self, action):
            return "no", (2.0 if action == "hello" else 0.0), False, False, {}

    err = rejected(contract.check_garbage, on(PaysTwoForEmpty()), 6)
    assert (err.check, err.msg) == ("step_types", "step('hello') reward 2.0 is outside [-1, 1]")
    contract.check_garbage(on(PaysTwoForEmpty(), bound=10.0), 6)

    class RaisesOnLongText(EndlessEnv):
        def step(self, action):
            if len(action) > 1000:
                raise ValueError("too long")
            return super().step(action)

    err = rejected(contract.check_garbage, on(RaisesOnLongText()), 6)
    assert (err.check, err.msg) == ("garbage", "step raised ValueError: too long")


def test_every_seed_is_reset_and_a_reset_that_raises_names_the_check():
    class HatesFive(GuessEnv):
        def reset(self, seed=None):
            if seed == 5:
                raise ValueError("five")
            return super().reset(seed)

    p = on(HatesFive())
    contract.check_reset(p, [3, 4])
    assert p.worker.played("reset") == [3, 4]
    err = rejected(contract.check_reset, on(HatesFive()), [3, 5])
    assert (err.check, err.msg) == ("reset", "reset raised ValueError: five")


# -- trivial: doing nothing, generic actions, memorised answers ------------------------------------

SEEDS = [2, 3, 5, 6, 7]  # digits the generic actions (\boxed{}, \boxed{0}, \boxed{1}) never guess


def wins_also(action, seeds=None):
    """GuessEnv where `action` wins too (on `seeds` only, when given)."""

    class Env(GuessEnv):
        def step(self, sent):
            if sent == action and (seeds is None or self.answer in seeds):
                self.turns += 1
                return "yes", 1.0, True, False, {}
            return super().step(sent)

    return Env()


def trivial(env, seeds=SEEDS, max_turns=3, domain="game", oracle=True, episodes=None):
    episodes = episodes or solved(seeds)
    if not oracle:
        episodes = {seed: contract.Solved(e.first, None) for seed, e in episodes.items()}
    contract.check_trivial(on(env, domain), facts(max_turns, domain, oracle), episodes)


def test_a_game_whose_answers_differ_by_seed_is_not_trivial():
    trivial(GuessEnv())


@pytest.mark.parametrize("seed", [2, 3, 5])
def test_doing_nothing_must_not_win_on_any_of_the_first_three_seeds(seed):
    err = rejected(trivial, wins_also("\\boxed{}", {seed}))
    assert (err.check, err.msg) == ("trivial", f"doing nothing ('\\\\boxed{{}}' every turn) wins "
                                               f"(seed {seed})")


def test_an_env_that_raises_during_blind_play_is_a_trivial_reject():
    class HatesEmptyBoxes(GuessEnv):
        def step(self, action):
            if action == "\\boxed{}":
                raise ValueError("empty")
            return super().step(action)

    err = rejected(trivial, HatesEmptyBoxes())
    assert (err.check, err.msg) == ("trivial", "step raised ValueError: empty")


def test_doing_nothing_is_not_played_past_the_third_seed():
    trivial(wins_also("\\boxed{}", {6}))  # the generic actions win it once: luck


def test_doing_nothing_in_a_tool_use_env_is_answering_done():
    env = wins_also("<answer>done</answer>")
    err = rejected(trivial, env, domain="tool_use")
    assert err.msg == "doing nothing ('<answer>done</answer>' every turn) wins (seed 2)"


def test_generic_actions_fail_an_env_when_they_win_most_episodes_within_its_turns():
    err = rejected(trivial, wins_also("\\boxed{1}"))  # the third generic action
    assert (err.check, err.msg) == ("trivial", "cycling generic actions wins 3 of 3 episodes")
    trivial(wins_also("\\boxed{1}"), max_turns=2)  # never reached in two turns
    trivial(wins_also("\\boxed{1}", {2, 3}))  # two of five: luck


def test_the_same_episode_on_every_seed_is_trivial_for_an_env_with_a_solution():
    same = {seed: contract.Solved(["Guess.", {}], ["\\boxed{4}"]) for seed in SEEDS[:3]}
    err = rejected(trivial, GuessEnv(), SEEDS[:3], episodes=same)
    assert (err.check, err.msg) == ("trivial", "all 3 seeds give the same episode (does reset "
                                    "ignore its seed?): one memorised action list wins every one")
    trivial(GuessEnv(), SEEDS[:3], oracle=False, episodes=same)  # no answers to tell them apart
    # our tool-use API's designer writes setup(), not reset: the question names what it wrote
    err = rejected(contract.check_trivial, on(GuessEnv(), "tool_use"), facts(3, "tool_use"), same)
    assert "(does setup() draw the task from self.rng?)" in err.msg
    err = rejected(contract.check_trivial, on(GuessEnv(), "tool_use"), facts(3, "tool_use"), same,
                   own_api=False)
    assert "(does reset ignore its seed?)" in err.msg


def test_the_same_solution_on_more_seeds_than_were_drawn_is_trivial_whatever_they_show():
    seeds = [4, 14, 24, 34, 44, 54]  # answer 4 each, with its own observation
    err = rejected(trivial, GuessEnv(), seeds)
    assert (err.check, err.msg) == ("trivial", "all 6 seeds have the same solution (does the "
                                    "answer ignore the seed?): one memorised action list wins "
                                    "every one")
    trivial(GuessEnv(), seeds[:contract.VALIDATION_SEEDS])  # no spare drawn: they may agree
    trivial(GuessEnv(), seeds, oracle=False)


class WithinOneEnv(GuessEnv):
    """Any digit within one of the answer wins."""

    def step(self, action):
        self.turns += 1
        near = {f"\\boxed{{{self.answer + d}}}" for d in (-1, 0, 1)}
        return ("yes", 1.0, True, False, {}) if action in near else \
            ("no", 0.0, False, self.turns >= self.max_turns, {})


def test_another_seeds_solution_winning_most_episodes_is_trivial():
    err = rejected(trivial, WithinOneEnv(), [4, 5, 6, 7, 9])
    assert (err.check, err.msg) == ("trivial", "replaying another seed's solution wins 3 of 3 "
                                               "episodes")
    trivial(WithinOneEnv(), [4, 6, 8, 2, 9])  # only 9 takes 8's: luck


def test_a_neighbour_with_the_same_answer_is_not_replayed_as_another_seeds_solution():
    trivial(GuessEnv(), [2, 12, 22, 32, 3])  # four seeds hide 2: a replay of 2 there is no guess


# -- solve: solution() in a worker of its own ----------------------------------------------------

@pytest.fixture
def jail(monkeypatch):
    """`jail(make_env, domain)`: contract's workers play fresh envs from make_env in-process."""

    def install(make_env=GuessEnv, domain="game"):
        made = Jail(make_env, domain)
        monkeypatch.setattr(contract, "Worker", made)
        return made

    return install


OURS = contract.EnvClass("GuessEnv", reference=False, solution=True)


def test_solve_records_each_seeds_first_observation_and_solution(jail):
    made = jail()
    got = contract.solve(None, "src", Seeds([3, 4]), OURS)
    assert got == {3: contract.Solved(["Guess my digit (3).", {}], ["\\boxed{3}"]),
                   4: contract.Solved(["Guess my digit (4).", {}], ["\\boxed{4}"])}
    assert [op for op, _ in made.workers[0].calls] == ["load", "reset", "solution", "reset",
                                                       "solution"]


def test_solve_draws_spare_seeds_only_while_every_solution_agrees(jail):
    jail()
    seeds = Seeds([3, 13], [23, 4, 5])
    assert list(contract.solve(None, "src", seeds, OURS)) == [3, 13, 23, 4]
    assert (seeds.used, seeds.spare) == ([3, 13, 23, 4], [5])
    seeds = Seeds([3, 4], [5])
    contract.solve(None, "src", seeds, OURS)
    assert (seeds.used, seeds.spare) == ([3, 4], [5])


def test_an_env_without_solution_is_only_reset_and_draws_no_spare(jail):
    made = jail()
    seeds = Seeds([3, 13], [23])
    got = contract.solve(None, "src", seeds, contract.EnvClass("GuessEnv", True, False))
    assert got == {3: contract.Solved(["Guess my digit (3).", {}], None),
                   13: contract.Solved(["Guess my digit (13).", {}], None)}
    assert "solution" not in [op for op, _ in made.workers[0].calls] and seeds.spare == [23]


def test_solve_blames_a_failing_reset_on_reset_and_a_failing_solution_on_the_oracle(jail):
    class NoSolution(GuessEnv):
        def solution(self):
            raise KeyError("answer")

    jail(NoSolution)
    err = rejected(contract.solve, None, "src", Seeds([3, 4]), OURS)
    assert (err.check, err.msg) == ("oracle", "solution raised KeyError: 'answer'")
    jail(type("NoReset", (GuessEnv,), {"reset": NoSolution.solution}))
    assert rejected(contract.solve, None, "src", Seeds([3, 4]), OURS).check == "reset"


def test_a_solution_that_is_no_action_list_names_its_seed(jail):
    jail(type("Empty", (GuessEnv,), {"solution": lambda self: []}))
    err = rejected(contract.solve, None, "src", Seeds([3, 4]), OURS)
    assert (err.check, err.msg) == ("oracle", "solution() for seed 3 must return a non-empty list "
                                              "of action strings, got list of length 0")


def test_solution_actions_are_what_a_reply_sends(jail):
    class Chatty(GuessEnv):
        def solution(self):
            return [f"I say \\boxed{{{self.answer}}} now"]

    jail(Chatty)
    assert contract.solve(None, "src", Seeds([3, 4]), OURS)[3].actions == ["\\boxed{3}"]
    jail(Chatty, "tool_use")  # our tool-use API: replayed ending with finish(); the reference's not
    assert contract.solve(None, "src", Seeds([3, 4]), OURS)[3].actions == [
        "I say \\boxed{3} now", "<answer>done</answer>"]
    reference = contract.EnvClass("GuessEnv", reference=True, solution=True)
    assert contract.solve(None, "src", Seeds([3, 4]), reference)[3].actions == [
        "I say \\boxed{3} now"]


def test_a_solution_action_no_reply_can_carry_fails_the_oracle(jail):
    jail(type("Escaped", (GuessEnv,), {"solution": lambda self: ["\\boxed{1}", "\x08oxed{3}"]}))
    err = rejected(contract.solve, None, "src", Seeds([3, 4]), OURS)
    assert err.check == "oracle"
    assert err.msg.startswith('solution() action 2 for seed 3 holds a backspace ("\\b")')


# -- every runtime check, in order ---------------------------------------------------------------

def test_a_valid_game_passes_every_runtime_check_in_the_documented_order(jail):
    made = jail()
    got = contract.runtime_checks(None, GAME, [3, 4, 3])
    assert got == EnvFacts("GuessEnv", "game", 3, [], True)
    solver, player = made.workers
    assert solver.played("reset") == [3, 4]
    # reset every seed, determinism on the first twice, then garbage on the second
    assert player.played("reset")[:5] == [3, 4, 3, 3, 4]


def test_both_workers_load_the_source_in_the_validations_sandbox(jail):
    made = jail()
    sandbox = Sandbox(limits=Limits(lifetime=60))
    contract.runtime_checks(sandbox, GAME, [3, 4])
    assert made.sandboxes == [sandbox, sandbox]
    assert all(worker.calls[0] == ("load", {"source": GAME}) for worker in made.workers)


def test_spare_seeds_drawn_while_the_solutions_agreed_are_reset_and_recorded(jail):
    made = jail()
    seeds = Seeds([3, 13], [23, 4, 5])
    contract.runtime_checks(None, GAME, seeds)
    assert seeds.used == [3, 13, 23, 4]
    assert made.workers[1].played("reset")[:6] == [3, 13, 23, 4, 3, 3]


def test_the_runtime_checks_need_two_distinct_seeds(jail):
    jail()
    with pytest.raises(ValueError, match="^runtime checks need at least two distinct seeds$"):
        contract.runtime_checks(None, GAME, [3, 3])


def test_the_oracle_runs_only_for_an_env_with_a_solution(jail):
    jail(ZeroPayEnv)
    assert rejected(contract.runtime_checks, None, GAME, [3, 4]).check == "oracle"
    reference = GAME.replace("class TinyEnv:\n", "class TinyEnv:\n    def __init__(self, "
                             "max_turns=10, **kwargs):\n        pass\n\n")
    without = reference.replace("def solution(", "def _solution(")
    assert contract.runtime_checks(None, without, [3, 4]).oracle is False


def test_a_lost_oracle_names_the_global_random_draw_the_source_makes(jail):
    jail(ZeroPayEnv)
    source = "import random\n" + GAME.replace('        return "hi", {}',
                                              '        self.x = random.random()\n'
                                              '        return "hi", {}')
    err = rejected(contract.runtime_checks, None, source, [3, 4])
    assert err.msg.endswith("(terminated=True, reward=0.0): reset() draws from the global random "
                            "module (line 4: random.random), not self.rng or random.Random(seed):"
                            " the same seed gives each worker another episode, so solution(), "
                            "computed in another worker, does not fit it; draw from self.rng")


def test_a_replay_that_differs_names_the_global_random_draw_the_source_makes(jail):
    jail(CountingResetEnv)
    err = rejected(contract.runtime_checks, None, "import random\n" + GAME.replace(
        '        return "hi", {}', '        self.x = random.random()\n        return "hi", {}'),
        [3, 4])
    assert err.msg.startswith("reset(seed=3) gave different results in two workers: reset() "
                              "draws from the global random module (line 4: random.random)")


def test_a_reference_game_may_pay_up_to_ten_and_ours_up_to_one(jail):
    class PaysFive(GuessEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, 5.0 * reward, terminated, truncated, info

    jail(PaysFive)
    err = rejected(contract.runtime_checks, None, GAME, [3, 4])
    assert (err.check, err.msg) == ("step_types", "step('\\\\boxed{3}') reward 5.0 is outside "
                                                  "[-1, 1]")
    reference = GAME.replace("class TinyEnv:\n", "class TinyEnv:\n    def __init__(self, "
                             "max_turns=10, **kwargs):\n        pass\n\n")
    assert contract.runtime_checks(None, reference, [3, 4]).max_turns == 3


TOOL_USE = ("class DeskEnv(ToolUseBaseEnv):\n    def setup(self):\n        pass\n"
            "    def solution(self):\n        return []\n")


def test_a_tool_use_env_passes_the_reset_gate_and_records_its_tools(jail):
    made = jail(DeskEnv, "tool_use")
    got = contract.runtime_checks(None, TOOL_USE, [3, 4])
    assert got == EnvFacts("DeskEnv", "tool_use", 3, [{"name": "look"}], True)
    assert made.workers[1].calls[-2:] == [("reset", {"seed": 3}), ("tools", {})]
    jail(type("Desk", (DeskEnv,), {"criteria": lambda self: [True]}), "tool_use")
    err = rejected(contract.runtime_checks, None, TOOL_USE, [3, 4])
    assert (err.check, err.msg) == ("reset_gate", "criterion 1 already holds at reset (seed 3)")


def test_a_lost_tool_use_oracle_reads_the_criteria_of_our_api_only(jail):
    jail(type("Desk", (DeskEnv,), {"status": [True, False]}), "tool_use")
    err = rejected(contract.runtime_checks, None, TOOL_USE, [3, 4])
    assert err.msg.endswith("did not win (terminated=True, reward=0.0): 1 of 2 criteria hold "
                            "after its actions")
    reference = TOOL_USE.replace("def setup(self):", "def reset(self, seed=None):")
    err = rejected(contract.runtime_checks, None, reference, [3, 4])
    assert err.msg == "replaying solution() for seed 3 did not win (terminated=True, reward=0.0)"


def test_a_tool_use_env_that_writes_its_own_call_is_told_to_use_the_base_classes():
    source = ("class DeskEnv(ToolUseBaseEnv):\n    max_turns = 5\n    def setup(self):\n"
              "        pass\n    def call(self, name, **a):\n        return name\n"
              "    def solution(self):\n        return [self.call('x')]\n")
    with pytest.raises(contract.ContractError) as err:
        contract.static_checks(source, is_source=True)
    assert err.value.check == "structure"
    assert err.value.msg.endswith("use them as self.call(...) and self.finish()")
