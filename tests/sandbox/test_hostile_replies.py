"""Hostile env programs against the reply boundary, through the real jail.

Each program below lies to, forges or breaks the protocol in its own way (its docstring says
how). Whatever it does, `Worker.call` must return a Reply (never raise), every ok result must be
writable by orjson (what shards use) with its op's types, and what the env did wrong must come
back as that env's `program_error` with a one-line reason.
"""

from __future__ import annotations

import textwrap

import pytest

from sandbox.jail import OUTCOMES, Reply, Worker

orjson = pytest.importorskip("orjson")

OPS = (("load", {}), ("reset", {"seed": 0}), ("step", {"action": "x"}), ("solution", {}),
       ("tools", {}), ("criteria", {}), ("step", {"action": "y"}))

FIND_PROTOCOL = '''
import os, sys

def protocol():
    """The worker's reply descriptor and the id of the request being served, from its frames."""
    frame = sys._getframe()
    while frame is not None:
        if isinstance(frame.f_locals.get("replies"), int):
            return frame.f_locals["replies"], frame.f_locals["request"]["id"]
        frame = frame.f_back
'''

GAME = '''
class HostileEnv:
    max_turns = 5

    def reset(self, seed=None):
        return {reset}

    def step(self, action):
        return {step}

    def solution(self):
        return ["x"]
'''


def game(reset: str = '"ready", {}', step: str = '"ok", 0.0, False, False, {}',
         prelude: str = "") -> str:
    return textwrap.dedent(prelude) + GAME.format(reset=reset, step=step)


def tool_env(tools: str, tool_body: str = 'return "fine"') -> str:
    return textwrap.dedent(f'''
    class HostileToolEnv(ToolUseBaseEnv):
        def setup(self):
            self.tools = {tools}
            self.state = {{"done": False}}
            self.instructions = ["look around"]
            self.criteria = [lambda state: state["done"]]

        def tool_look(self):
            {tool_body}

        def solution(self):
            return ['<tool_call>{{"name": "look", "arguments": {{}}}}</tool_call>']
    ''')


LOOK = '{"look": {"description": "look", "parameters": {"type": "object", "properties": {}}}}'


def run(worker: Worker, source: str, ops=OPS) -> list[Reply]:
    """Every op in turn (load with `source`); checks what must hold for any env whatsoever."""
    replies = []
    for op, fields in ops:
        reply = worker.call(op, **({"source": source} if op == "load" else fields))
        assert isinstance(reply, Reply) and reply.outcome in OUTCOMES, reply
        orjson.dumps([reply.result, reply.shape, reply.error])
        if not reply.ok:
            assert reply.error["msg"] and "\n" not in reply.error["msg"], reply
        replies.append(reply)
    return replies


def by_op(replies: list[Reply]) -> dict[str, Reply]:
    """The first reply to each op."""
    first: dict[str, Reply] = {}
    for (op, _), reply in zip(OPS, replies):
        first.setdefault(op, reply)
    return first


# -- lies about types --------------------------------------------------------------------------

def test_dict_subclass_named_tuple_is_a_bad_reset(make_worker):
    """reset returns an instance of `class tuple(dict)` whose items() raises: not a tuple."""
    source = game(prelude='''
        class tuple(dict):
            def items(self):
                raise RuntimeError("no")
        ''', reset='tuple({0: "obs", 1: {}})')
    reset = by_op(run(make_worker(), source))["reset"]
    assert reset.outcome == "program_error" and reset.error["type"] == "bad_reply", reset
    assert reset.error["msg"] == "reset: must return (observation, info), got dict"


def test_an_object_posing_as_a_tuple_is_a_bad_reset(make_worker):
    """reset returns an object whose __class__ claims to be tuple (isinstance believes it)."""
    source = game(prelude='''
        class FakeTuple:
            __class__ = tuple
            def __iter__(self):
                return iter(["obs", {}])
            def __len__(self):
                return 2
        ''', reset="FakeTuple()")
    reset = by_op(run(make_worker(), source))["reset"]
    assert reset.error["msg"] == "reset: must return (observation, info), got FakeTuple", reset


def test_subclasses_that_lie_are_read_through_their_base_types(make_worker):
    """str, tuple, int, float and dict subclasses whose methods lie or raise."""
    source = game(prelude='''
        class Obs(str):
            def __str__(self): raise RuntimeError("no")
            def __len__(self): return 10**6
            def encode(self, *a, **k): raise RuntimeError("no")
        class Reward(float):
            def __float__(self): return float("nan")
            def __repr__(self): return "oops"
        class Flag(int):
            def __int__(self): return 7
        class Info(dict):
            def items(self): return [("forged", 1)]
            def keys(self): return ["forged"]
        class Result(tuple):
            def __iter__(self): return iter(["forged"])
            def __len__(self): return 1
            def __getitem__(self, i): return "forged"
        ''', step='Result((Obs("real obs"), Reward(0.5), Flag(0), False, Info(real=1)))')
    step = by_op(run(make_worker(), source))["step"]
    assert step.outcome == "program_error", step  # a subclass of int is not a bool
    assert step.error["msg"] == "step: terminated must be bool, got int"
    source = source.replace("Flag(0), False", "False, False")
    step = by_op(run(make_worker(), source))["step"]
    assert step == Reply("ok", ["real obs", 0.5, False, False, {"real": 1}], ["tuple", 5])


@pytest.mark.parametrize("reward,problem", [
    ("10**400", "step: an int of 1329 bits (more than 64) at reward"),
    ("2**64", "more than 64"),
    ('float("nan")', "reward must be a number, got float nan"),
    ('float("-inf")', "reward must be a number, got float -inf"),
    ('"1.0"', "reward must be a number, got str"),
    ("None", "reward must be a number, got NoneType"),
], ids=["10**400", "2**64", "nan", "-inf", "str", "None"])
def test_rewards_that_are_not_finite_64_bit_numbers_are_bad_steps(make_worker, reward, problem):
    step = by_op(run(make_worker(), game(step=f'"obs", {reward}, True, False, {{}}')))["step"]
    assert step.outcome == "program_error" and step.error["type"] == "bad_reply", step
    assert problem in step.error["msg"], step


def test_an_int_too_long_to_write_is_a_program_error(make_worker):
    """10**5000 has more digits than Python will print: the worker cannot encode it."""
    step = by_op(run(make_worker(), game(step='"obs", 10**5000, True, False, {}')))["step"]
    assert step.outcome == "program_error" and step.error["type"] == "EncodeError", step


def test_get_tools_returning_a_dict_is_a_bad_reply(make_worker):
    source = game() + '''
    def get_tools(self):
        return {"look": {"description": "look"}}
'''
    tools = by_op(run(make_worker(), source))["tools"]
    assert tools.error["msg"] == "tools: get_tools() must return a list of tool schemas, got dict"


def test_a_tool_schema_with_an_int_beyond_64_bits_is_a_bad_reply(make_worker):
    """The int reaches the parent twice: in reset's info and from get_tools()."""
    tools = '{"look": {"description": "d", "parameters": {"type": "object", "maximum": 2**65}}}'
    first = by_op(run(make_worker(), tool_env(tools)))
    for op in ("reset", "tools"):
        assert first[op].error["type"] == "bad_reply" and "more than 64" in first[op].error["msg"]


def test_odd_info_keys_and_deep_values_arrive_as_plain_json(make_worker):
    source = game(prelude="""
        deep = []
        for _ in range(1000):
            deep = [deep]
        loop = []
        loop.append(loop)
        """, step='"obs", 0, False, False, {2: "a", None: "b", (1, 2): "c", True: "d", '
                  '1.5: "e", "deep": deep, "loop": loop, "set": {1}}')
    step = by_op(run(make_worker(), source))["step"]
    assert step.ok, step
    info = step.result[4]
    assert {k: info[k] for k in ("2", "null", "(1, 2)", "true", "1.5")} == {
        "2": "a", "null": "b", "(1, 2)": "c", "true": "d", "1.5": "e"}
    assert info["set"] == {"__object__": "set", "repr": "{1}"}


# -- text that orjson refuses ------------------------------------------------------------------

def test_lone_surrogates_are_replaced_wherever_they_come_from(make_worker):
    """In an observation, an info key, an exception message and a tool result."""
    source = game(reset='"ready \\udc00", {"k\\ud800": "v"}',
                  step='1 / 0 if action == "x" else (_ for _ in ()).throw(ValueError("\\ud800"))')
    first = by_op(run(make_worker(), source))
    assert first["reset"].result == ["ready \ufffd", {"k\ufffd": "v"}]
    assert first["step"].error["msg"].startswith("division by zero (env.py:")
    replies = run(make_worker(), source, [("load", {}), ("reset", {"seed": 0}),
                                          ("step", {"action": "y"})])
    assert replies[2].error["msg"].startswith("\ufffd (env.py:"), replies[2]
    call = '<tool_call>{"name": "look", "arguments": {}}</tool_call>'
    replies = run(make_worker(), tool_env(LOOK, 'return "seen \\udfff"'),
                  [("load", {}), ("reset", {"seed": 0}), ("step", {"action": call})])
    assert replies[2].ok and "seen \ufffd" in replies[2].result[0], replies[2]


def test_an_exception_that_cannot_be_shown_or_spans_lines(make_worker):
    source = game(prelude='''
        class Odd(Exception):
            def __str__(self):
                return 1 / 0
        Odd.__name__ = "Odd\\nName"
        ''', step='(_ for _ in ()).throw(Odd() if action == "x" else ValueError("a\\nb\\r\\nc"))')
    first = by_op(run(make_worker(), source))
    assert first["step"].error["type"] == "Odd Name", first
    assert first["step"].error["msg"].startswith("<Odd Name that cannot be shown> (env.py:")
    assert first["solution"].ok
    replies = run(make_worker(), source, [("load", {}), ("reset", {"seed": 0}),
                                          ("step", {"action": "y"})])
    assert replies[2].error["msg"].startswith("a b c (env.py:"), replies[2]



def test_a_metaclass_that_lies_about_names_changes_nothing(make_worker):
    """Type names are read through type's own descriptor: a metaclass property never runs."""
    source = game(prelude='''
        class Liar(type):
            @property
            def __name__(cls):
                raise RuntimeError("no name")
        class Boom(Exception, metaclass=Liar):
            pass
        class Board(metaclass=Liar):
            pass
        ''', reset="Board(), {}", step="(_ for _ in ()).throw(Boom())")
    first = by_op(run(make_worker(), source))
    assert first["reset"].error["msg"] == "reset: observation must be str, got Board"
    assert first["step"].error["type"] == "Boom", first["step"]

# -- forging the protocol ----------------------------------------------------------------------

@pytest.mark.parametrize("forged", [b"null\n", b"[1]\n", b'{"id": \n', b"\xff\xfe\n"],
                         ids=["null", "[1]", "half-a-reply", "bad-utf8"])
def test_a_forged_line_on_the_protocol_pipe_ends_the_worker(make_worker, forged):
    source = game(prelude=FIND_PROTOCOL + f"FORGED = {forged!r}\n",
                  step='os.write(protocol()[0], FORGED) and ("real", 0, False, False, {})')
    replies = run(make_worker(), source)
    step = by_op(replies)["step"]
    assert step.outcome == "program_error" and step.error["type"] == "protocol", step
    assert replies[-1] is step  # the worker is gone: every later call gets the same reply


def test_a_forged_reply_with_the_right_id_is_caught_on_the_next_call(make_worker):
    """The forgery answers this request (checked like any reply); the real reply that follows
    answers no request, so the next call sees a reply out of order."""
    source = game(prelude=FIND_PROTOCOL + textwrap.dedent('''
        import json
        def forge(result):
            fd, request_id = protocol()
            line = {"id": request_id, "ok": True, "result": result, "shape": ["tuple", 5]}
            os.write(fd, json.dumps(line).encode() + b"\\n")
        '''), step='forge(["forged", 10**400, True, False, {}]) or ("real", 0, False, False, {})')
    replies = run(make_worker(), source)
    step, solution = replies[2], replies[3]
    assert step.error["type"] == "bad_reply" and "more than 64" in step.error["msg"], step
    assert solution.error["type"] == "protocol", solution


def test_patching_json_os_and_sys_in_the_worker_changes_no_reply(make_worker):
    source = game(prelude='''
        import json, os, sys
        json.dumps = lambda *a, **k: "null"
        json.loads = lambda *a, **k: None
        json.JSONEncoder.encode = lambda *a, **k: "null"
        json.JSONEncoder.iterencode = lambda *a, **k: iter(["null"])
        json.JSONDecoder.decode = lambda *a, **k: None
        json.JSONDecoder.raw_decode = lambda *a, **k: (None, 0)
        json.encoder.encode_basestring_ascii = lambda s: '"forged"'
        os.write = lambda fd, data: len(data)
        sys.stdout = None
        ''', step='"real", 0.5, True, False, {"n": 1}')
    replies = run(make_worker(), source)
    assert [r.outcome for r in replies] == ["ok"] * 3 + ["ok", "program_error",
                                                         "program_error", "ok"], replies
    assert replies[2].result == ["real", 0.5, True, False, {"n": 1}]
    assert replies[4].error["type"] == "AttributeError"  # a game has no get_tools


# -- where an env failed --------------------------------------------------------------------

def test_env_errors_name_the_line_in_the_env(make_worker):
    source = textwrap.dedent('''
        def helper(n):
            return n / 0

        class LineEnv:
            def reset(self, seed=None):
                return "ready", {}

            def step(self, action):
                if action == "helper":
                    return helper(1)
                return {}["missing"]

            def solution(self):
                return ["x"]
        ''')
    worker = make_worker()
    replies = run(worker, source, [("load", {}), ("reset", {"seed": 0}),
                                   ("step", {"action": "helper"}), ("step", {"action": "key"})])
    assert replies[2].error["msg"] == "division by zero (env.py:3: return n / 0)"
    assert replies[3].error["msg"] == "'missing' (env.py:12: return {}[\"missing\"])"
    assert 'File "env.py", line 3, in helper\n    return n / 0' in replies[2].error["trace"]


def test_an_error_at_import_names_its_line(make_worker):
    load = make_worker().call("load", source="x = 1\ny = [][3]\n")
    assert load.error["msg"] == "list index out of range (env.py:2: y = [][3])", load


def test_a_tool_use_setup_error_names_the_setup_line(make_worker):
    """The error passes through ToolUseBaseEnv.reset: the env's own innermost line is named."""
    source = tool_env(LOOK).replace('self.state = {"done": False}', 'self.state = {}["x"]')
    replies = run(make_worker(), source, [("load", {}), ("reset", {"seed": 0})])
    assert replies[1].error["msg"].startswith("'x' (env.py:5: self.state = {}[\"x\"])"), replies
