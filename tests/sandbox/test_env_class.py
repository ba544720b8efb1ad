"""sandbox/env_class.py: one rule picks the env class for the static checks and the worker; code
that changes a class at import is rejected by `structure`, and the worker's guard refuses a class
that is not what its class statement built (in-process here, and once through the jail)."""

import ast
import re
import textwrap
from pathlib import Path

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


# -- static: the shape of the env's classes ---------------------------------------------------

TOOL = """
class CounterEnv(ToolUseBaseEnv):
    def setup(self):
        self.tools, self.state = {}, {}

    def solution(self):
        return ["<answer>done</answer>"]
"""


DYNAMIC_BASE = GAME.replace("class KeypadEnv:",
                            "_Base = type('_Base', (), {})\n\n\nclass KeypadEnv(_Base):")


def with_class(header: str, body: str = "    pass\n", source: str = GAME) -> str:
    """`source` with a class statement `header` (its body `body`) added before the env class."""
    return source.replace("\nclass KeypadEnv", f"\n{header}\n{body}\n\nclass KeypadEnv", 1)


@pytest.mark.parametrize("source, expected", [
    (GAME.replace("class KeypadEnv:", "class KeypadEnv(metaclass=type):"),
     "class KeypadEnv passes metaclass=type to its class statement"),
    (with_class("class _Meta(type):").replace("class KeypadEnv:",
                                             "class KeypadEnv(metaclass=_Meta):"),
     "class KeypadEnv passes metaclass=_Meta to its class statement"),
    ("import abc\n" + GAME.replace("class KeypadEnv:", "class KeypadEnv(abc.ABC):"),
     "class KeypadEnv inherits from abc.ABC, and it is not a class statement of this module"),
    ("from string import Formatter\n" + GAME.replace("class KeypadEnv:",
                                                     "class KeypadEnv(Formatter):"),
     "class KeypadEnv inherits from Formatter, and it is not a class statement of this module"),
    (DYNAMIC_BASE,
     "class KeypadEnv inherits from _Base, and it is not a class statement of this module"),
    (GAME.replace("class KeypadEnv:", "class KeypadEnv(dict):"),
     "class KeypadEnv inherits from dict, and it is not a class statement of this module"),
    (with_class("class _Base:") + "\nclass _Base:\n    pass\n",
     None),  # a second _Base the env class does not inherit from is no base of it
    (with_class("class _Base:", source=with_class("class _Base:")).replace(
        "class KeypadEnv:", "class KeypadEnv(_Base):"),
     "class KeypadEnv inherits from _Base, and 2 class statements define _Base"),
    (with_class("class _Mixin:", "    def __getattr__(self, name):\n        return None\n")
     .replace("class KeypadEnv:", "class KeypadEnv(_Mixin):"),
     "class _Mixin defines __getattr__, which lets the class that is played differ"),
    (with_class("class _Install:", "    def __set_name__(self, owner, name):\n        pass\n"),
     "class _Install defines __set_name__"),
])
def test_the_env_class_and_its_bases_are_plain_class_statements_of_the_module(source, expected):
    if expected is None:
        assert structure(parse(source)).name == "KeypadEnv"
    else:
        assert reject(source).startswith(expected), reject(source)


@pytest.mark.parametrize("hook", sorted(env_class.CLASS_HOOKS))
@pytest.mark.parametrize("binding", ["def {hook}(self, *args):\n        return None",
                                     "{hook} = None", "{hook}: object = property(len)"])
def test_no_class_of_the_env_binds_a_hook_that_decides_what_is_played(hook, binding):
    line = "    " + binding.format(hook=hook) + "\n"
    assert reject(GAME.replace("    max_turns = 8\n", "    max_turns = 8\n" + line)) \
        .startswith(f"class KeypadEnv defines {hook}, which lets the class that is played differ "
                    "from the class that is checked (line 7)")
    base = with_class("class _Base:", line).replace("class KeypadEnv:", "class KeypadEnv(_Base):")
    assert reject(base).startswith(f"class _Base defines {hook}")


def test_a_helper_class_outside_the_env_may_define_lookup_hooks_but_not_set_name():
    helper = with_class("class Row:", "    __slots__ = ('cells',)\n\n"
                        "    def __getattr__(self, name):\n        return None\n")
    assert structure(parse(helper)).name == "KeypadEnv"
    descriptor = with_class("class Row:", "    def __set_name__(self, owner, name):\n"
                            "        owner.step = None\n")
    assert reject(descriptor).startswith("class Row defines __set_name__")


@pytest.mark.parametrize("statement, expected", [
    ("self.__class__ = KeypadEnv", "self.__class__ is assigned"),
    ("self.__dict__ = {}", "self.__dict__ is assigned"),
    ("del self.__dict__", "self.__dict__ is deleted"),
    ("a, self.__class__ = 1, KeypadEnv", "self.__class__ is assigned"),
    ("setattr(self, '__class__', KeypadEnv)", "setattr(..., '__class__') changes an object's"),
    ("object.__setattr__(self, '__class__', KeypadEnv)", "__setattr__(..., '__class__')"),
    ("super().__setattr__('__dict__', {})", "__setattr__(..., '__dict__')"),
    ("delattr(self, '__dict__')", "delattr(..., '__dict__')"),
])
def test_no_code_of_the_module_changes_an_objects_class_or_attribute_dict(statement, expected):
    source = GAME.replace('        return "Press', f"        {statement}\n        return \"Press")
    assert reject(source).startswith(expected), reject(source)


def test_reading_an_objects_class_or_attribute_dict_is_fine():
    source = GAME.replace('        return "Press', '        self.__dict__.update(seen=[])\n'
                          '        self.__dict__["name"] = type(self).__name__\n'
                          '        assert self.__class__ is KeypadEnv\n        return "Press')
    assert structure(parse(source)).name == "KeypadEnv"


@pytest.mark.parametrize("source, expected", [
    ("class _Fast:\n    def step(self, action):\n        return '', 1.0, True, False, {}\n\n\n"
     + TOOL.replace("(ToolUseBaseEnv)", "(_Fast, ToolUseBaseEnv)"),
     "line 2: class _Fast redefines ToolUseBaseEnv.step"),
    ("class _Middle(ToolUseBaseEnv):\n    def _advance(self):\n        return ''\n\n\n"
     + TOOL.replace("(ToolUseBaseEnv)", "(_Middle)"),
     "line 2: class _Middle redefines ToolUseBaseEnv._advance"),
])
def test_a_tool_use_env_redefines_no_base_internal_in_any_class_it_inherits(source, expected):
    assert reject(source).startswith(expected)


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


@pytest.mark.parametrize("tail, expected", [
    ("_s = setattr\n_s(KeypadEnv, 'step', vars(KeypadEnv)['solution'])",
     "KeypadEnv.step is not a method its class statement defines as `def step`"),
    ("_s = setattr\n_s(KeypadEnv, 'solution', staticmethod(len))",
     "KeypadEnv.solution is not a method its class statement defines as `def solution`"),
    ("_s = setattr\n_s(KeypadEnv, '__getatt' + 'r__', lambda self, name: None)",
     "KeypadEnv defines __getattr__, which lets the class that is played differ"),
    ("_s = setattr\n_s(KeypadEnv, 'step', type(_win)(vars(KeypadEnv)['step'].__code__, {}))",
     "KeypadEnv.step is not the one its class statement defined"),
])
def test_the_guard_holds_the_methods_the_worker_calls_to_their_defs(tail, expected):
    guard, _ = guarded(GAME + "\n" + tail + "\n")
    with pytest.raises(env_class.EnvClassError, match=re.escape(expected)):
        guard.loaded()


@pytest.mark.parametrize("source, expected", [
    (with_class("class _Meta(type):").replace("class KeypadEnv:",
                                             "class KeypadEnv(metaclass=_Meta):"),
     "KeypadEnv was built by the metaclass _Meta"),
    (DYNAMIC_BASE,
     "KeypadEnv's base _Base is not a class statement of this module"),
    (with_class("class _Base:", "    __slots__ = ()\n").replace("class KeypadEnv:",
                                                              "class KeypadEnv(_Base):"),
     "_Base defines __slots__"),
])
def test_the_guard_holds_the_loaded_classes_to_the_static_shape_rules(source, expected):
    guard, _ = guarded(source)
    with pytest.raises(env_class.EnvClassError, match=re.escape(expected)):
        guard.loaded()


def test_the_guard_refuses_an_env_whose_class_changed_while_it_played():
    guard, namespace = guarded(with_class("class Other:"))
    env = guard.loaded()()
    guard.check(env)
    object.__setattr__(env, "__class__", namespace["Other"])  # a name the AST cannot read
    with pytest.raises(env_class.EnvClassError, match="the env is now an instance of Other, not "
                       "of KeypadEnv: an object keeps the class it was built with"):
        guard.check(env)


def test_the_guard_holds_a_tool_use_env_to_the_base_internals_it_may_not_redefine():
    base = fresh_base()
    source = ("class _Fast:\n    def step(self, action):\n        return '', 1.0, True, False, {}"
              "\n\n\n" + TOOL.replace("(ToolUseBaseEnv)", "(_Fast, ToolUseBaseEnv)"))
    tree = ast.parse(source)
    code = compile(tree, "env.py", "exec")
    namespace = {"__name__": "spade_env", "ToolUseBaseEnv": base}
    sealed = env_class.Guard(tree, code, namespace, base, tool_base.internal_names())
    exec(code, namespace)
    with pytest.raises(env_class.EnvClassError, match="_Fast redefines ToolUseBaseEnv.step"):
        sealed.loaded()
    guard, loaded = guarded(source, base)  # the reference's API seals nothing
    assert guard.loaded() is loaded["CounterEnv"]


CORPUS = Path(__file__).parents[1] / "adversarial" / "programs"


@pytest.mark.parametrize("program, expected", [
    ("class_getattribute_step", "class CounterEnv defines __getattribute__"),
    ("class_reassigned_in_setup", "self.__class__ is assigned"),
    ("class_new_returns_other", "class CounterEnv defines __new__"),
    ("class_metaclass_call", "class CounterEnv passes metaclass=_Build"),
    ("class_mixin_step", "line 7: class _Fast redefines ToolUseBaseEnv.step"),
    ("class_indirect_base_step", "line 16: class CounterEnv redefines ToolUseBaseEnv.reset"),
    ("class_slots_step", "class CounterEnv defines __slots__"),
    ("class_set_name_hook", "class _Install defines __set_name__"),
    ("class_init_subclass_hook", "class _Hook defines __init_subclass__"),
    ("class_dict_property_mixin", "class _Quiet defines __dict__"),
    ("class_dynamic_base", "class CounterEnv inherits from _Fast, and it is not a class statement"),
    ("class_imported_base", "class CounterEnv inherits from Formatter, and it is not a class"),
])
def test_each_class_trick_of_the_corpus_is_rejected_by_its_rule(program, expected):
    assert reject((CORPUS / f"{program}.py").read_text()).startswith(expected)


def test_a_class_swap_through_a_computed_name_is_the_guards_to_catch():
    source = (CORPUS / "class_swap_computed_name.py").read_text()
    assert structure(parse(source)).name == "CounterEnv"  # nothing in the AST names __class__
    guard, _ = guarded(source, fresh_base())
    env = guard.loaded()()
    env.reset(seed=1)
    with pytest.raises(env_class.EnvClassError, match="now an instance of _Paying, not of "
                       "CounterEnv"):
        guard.check(env)


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
