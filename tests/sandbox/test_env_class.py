"""sandbox/env_class.py: one rule picks the env class for the static checks and the worker; code
that changes a class at import is rejected by `structure`, and the worker's guard refuses a class
that is not what its class statement built (in-process here, and once through the jail)."""

import ast
import textwrap

import pytest

from sandbox import env_class, tool_base
from sandbox.contract import ContractError, parse, structure
from sandbox.jail import Worker

GAME = '''
import random


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.key = random.Random(seed).choice("ABCDEFGH")
        return "Press the key " + self.key + " as \\\\boxed{A}.", {}

    def step(self, action):
        won = action == "\\\\boxed{%s}" % self.key
        return ("Open." if won else "Locked."), float(won), won, False, {}

    def solution(self):
        return ["\\\\boxed{%s}" % self.key]


def _win(self, action):
    return "Open.", 1.0, True, False, {}
'''


def reject(source: str) -> str:
    with pytest.raises(ContractError) as caught:
        structure(parse(textwrap.dedent(source)))
    assert caught.value.check == "structure"
    return caught.value.msg


# -- the rule ----------------------------------------------------------------------------------

def test_the_env_class_is_the_one_top_level_class_ending_in_env():
    tree = ast.parse(GAME + "\nclass Helper:\n    pass\n\nclass ToolUseBaseEnv:\n    pass\n")
    assert env_class.env_class(tree).name == "KeypadEnv"


def test_two_env_classes_are_a_reject_naming_both():
    message = reject(GAME + "\nclass PayingEnv(KeypadEnv):\n    pass\n")
    assert message.startswith("2 top-level classes end in 'Env': KeypadEnv (line 5), PayingEnv")


def test_no_env_class_is_a_reject():
    assert reject("class Keypad:\n    pass\n") == "no top-level class whose name ends in 'Env'"


def test_an_env_named_after_the_injected_base_is_told_how_to_name_it():
    """What 4 of 12 tool-use designs of a 1.5B coder did: the env itself called ToolUseBaseEnv."""
    message = reject("class ToolUseBaseEnv:\n    def setup(self):\n        self.tools = {}\n")
    assert message == ("no top-level class whose name ends in 'Env' but ToolUseBaseEnv, the base "
                       "class the jail injects: name the env `class <Name>Env(ToolUseBaseEnv)` "
                       "and do not define ToolUseBaseEnv")


# -- static: import-time changes to a class ----------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    ("KeypadEnv.step = _win", "module-level assignment replaces KeypadEnv.step (line 22)"),
    ("KeypadEnv.step.__code__ = _win.__code__",
     "module-level assignment replaces KeypadEnv.step.__code__ (line 22)"),
    ("setattr(KeypadEnv, 'step', _win)", "setattr at import replaces KeypadEnv.step (line 22)"),
    ("object.__setattr__(KeypadEnv, 'step', _win)",
     "__setattr__ at import replaces KeypadEnv.step (line 22)"),
    ("del KeypadEnv.step", "del of KeypadEnv.step (line 22)"),
    ("KeypadEnv.max_turns += 1", "module-level assignment replaces KeypadEnv.max_turns (line 22)"),
    ("ToolUseBaseEnv.step = _win",
     "module-level assignment replaces ToolUseBaseEnv.step (line 22)"),
    ("ToolUseBaseEnv.reset.__globals__['criteria_status'] = _win",
     "module-level assignment replaces ToolUseBaseEnv.reset.__globals__['criteria_status']"),
    ("E = KeypadEnv\nE.step = _win", "module-level assignment replaces E.step (line 23)"),
    ("KeypadEnv = type('KeypadEnv', (), {})", "KeypadEnv is bound again after its class statement"),
    ("globals()['KeypadEnv'] = None",
     "module-level assignment through globals()['KeypadEnv'] rebinds a module name"),
    ("from random import Random as KeypadEnv", "an import rebinds KeypadEnv"),
    ("def _install():\n    KeypadEnv.step = _win\n\n_install()",
     "module-level assignment replaces KeypadEnv.step (line 23)"),
    ("def _install():\n    global KeypadEnv\n    KeypadEnv = None",
     "'global KeypadEnv' lets a function rebind the env class"),
    ("if True:\n    getattr(KeypadEnv, 'step').__defaults__ = ()",
     "module-level assignment replaces getattr(KeypadEnv, 'step').__defaults__ (line 23)"),
])
def test_import_time_changes_to_a_class_are_rejected_with_what_and_where(line, expected):
    source = GAME.lstrip("\n") + "\n" + line + "\n"
    message = reject(source)
    assert message.startswith(expected), message
    assert "put every method in the class body" in message


def test_a_class_decorator_called_at_import_is_read_and_a_class_body_too():
    decorated = GAME.replace("class KeypadEnv:", "@_patch\nclass KeypadEnv:") + \
        "\ndef _patch(cls):\n    KeypadEnv.step = _win\n    return cls\n"
    assert "replaces KeypadEnv.step" in reject(decorated)
    in_body = GAME.replace("    max_turns = 8\n",
                           "    max_turns = 8\n    setattr(ToolUseBaseEnv, 'step', None)\n")
    assert "setattr at import replaces ToolUseBaseEnv.step" in reject(in_body)


def test_what_changes_only_instances_or_locals_is_not_an_import_time_patch():
    source = GAME + textwrap.dedent('''
        TABLE = {"a": 1}
        TABLE["b"] = 2
        board = [[0] * 3]
        board[0][1] = 1


        def helper(env):
            env.key = "A"  # an instance, in a function nobody calls at import
            KeypadEnv.cache = {}  # runs only if a method calls it: the worker's guard's job
    ''')
    assert structure(parse(source)).name == "KeypadEnv"


# -- at run time: the guard --------------------------------------------------------------------

def guarded(source: str, base=tool_base.ToolUseBaseEnv):
    """(guard, namespace) after running `source` as the worker does."""
    tree = ast.parse(source)
    code = compile(tree, "env.py", "exec")
    namespace = {"__name__": "spade_env", "ToolUseBaseEnv": base}
    guard = env_class.Guard(tree, code, namespace, base)
    exec(code, namespace)
    return guard, namespace


def fresh_base():
    namespace = {"__name__": "spade_tool_base"}
    with open(tool_base.__file__) as fh:
        exec(compile(fh.read(), tool_base.__file__, "exec"), namespace)
    return namespace["ToolUseBaseEnv"]


def test_the_guard_returns_the_class_its_statement_built():
    guard, namespace = guarded(GAME)
    assert guard.loaded() is namespace["KeypadEnv"]


@pytest.mark.parametrize("tail, expected", [
    ("_put = setattr\n_put(KeypadEnv, 'step', _win)",
     "KeypadEnv.step is not the one its class statement defined"),
    ("globals().update(KeypadEnv=type('KeypadEnv', (), {**vars(KeypadEnv), 'step': _win}))",
     "KeypadEnv.step is not the one its class statement defined"),
    ("globals().update(KeypadEnv=type('KeypadEnv', (dict,), dict(vars(KeypadEnv))))",
     "KeypadEnv's bases were changed"),
    ("globals().update(KeypadEnv=3)", "KeypadEnv is not a class after the module ran"),
    ("_f = getattr(KeypadEnv, 'step')\n_f.__code__ = _win.__code__",
     "KeypadEnv.step is not the one its class statement defined"),
    ("_d = delattr\n_d(KeypadEnv, 'solution')", "KeypadEnv.solution was removed"),
])
def test_the_guard_refuses_a_class_changed_where_the_static_check_cannot_see(tail, expected):
    guard, _ = guarded(GAME + "\n" + tail + "\n")
    with pytest.raises(env_class.EnvClassError, match=expected):
        guard.loaded()


def test_the_guard_refuses_a_changed_base_class_and_a_class_changed_during_play():
    base = fresh_base()
    source = GAME.replace("class KeypadEnv:", "class KeypadEnv(ToolUseBaseEnv):")
    guard, _ = guarded(source + "\n_s = setattr\n_s(ToolUseBaseEnv, '_met', _win)\n", base)
    with pytest.raises(env_class.EnvClassError, match="ToolUseBaseEnv changed: _met was replaced"):
        guard.loaded()
    guard, namespace = guarded(GAME)
    cls = guard.loaded()
    guard.check()
    cls.step = namespace["_win"]  # what a method could do while the env plays
    with pytest.raises(env_class.EnvClassError, match="KeypadEnv changed after its class "
                       "statement: step was replaced"):
        guard.check()


def test_the_guard_lets_an_env_change_its_own_class_data_while_it_plays():
    guard, _ = guarded(GAME.replace("    max_turns = 8\n", "    max_turns = 8\n    plays = 0\n"))
    cls = guard.loaded()
    cls.plays += 1  # a class-level counter, as some envs keep
    cls.seen = ["A"]
    guard.check()


def test_the_worker_plays_the_checked_class_and_refuses_a_patched_one(nsjail_ok):
    with Worker() as worker:
        facts = worker.call("load", source=GAME).result
        assert facts["class_name"] == "KeypadEnv"
        assert worker.call("reset", seed=1).ok
    with Worker() as worker:
        reply = worker.call("load", source=GAME + "\n_s = setattr\n_s(KeypadEnv, 'step', _win)\n")
        assert not reply.ok and reply.error["type"] == "EnvClassError"
        assert "KeypadEnv.step is not the one its class statement defined" in reply.error["msg"]
    during = GAME.replace('        return "Press', '        type(self).step = _win\n'
                                                    '        return "Press')
    with Worker() as worker:
        assert worker.call("load", source=during).ok
        reply = worker.call("reset", seed=1)
        assert not reply.ok and "step was replaced" in reply.error["msg"]
        assert not worker.call("step", action="\\boxed{A}").ok  # and every request after it
