"""sandbox/replies.py: any line a worker (or an env forging one) sends becomes a safe Reply.

Pure: no jail. The lines here are what a hostile env can put on the protocol pipe; the property
every test relies on is that `check` never raises and an ok reply is writable by orjson (what
shards use), with its op's types.
"""

from __future__ import annotations

import json
import random

import pytest

from sandbox.replies import MAX_DEPTH, MAX_TOOLS, Reply, check

orjson = pytest.importorskip("orjson")


def line(result=None, ok=True, shape=None, id=1, error=None) -> bytes:
    message = {"id": id, "ok": ok}
    if ok:
        message |= {"result": result, "shape": shape or guessed_shape(result)}
    else:
        message["error"] = error
    return json.dumps(message).encode()


def guessed_shape(result) -> list:
    kinds = {list: "tuple", dict: "dict", str: "str"}
    kind = kinds.get(type(result), type(result).__name__)
    return [kind, len(result) if type(result) in kinds else None]


def bad(reply: Reply, kind: str = "bad_reply") -> str:
    assert reply.outcome == "program_error" and reply.error["type"] == kind, reply
    assert "\n" not in reply.error["msg"]
    return reply.error["msg"]


STEP = ["obs", 0.5, False, False, {"turn": 1}]


def test_a_good_step_reply_passes_unchanged():
    reply = check("step", 1, line(STEP))
    assert reply == Reply("ok", STEP, ["tuple", 5])


BOOL_ID = b'{"id": true, "ok": true, "result": "pong", "shape": ["str", 4]}'


@pytest.mark.parametrize("raw", [b"null", b"[1]", b'"ok"', b"{}", b"not json", b"",
                                 b"[" * 100_000, b'{"ok": true}', BOOL_ID],
                         ids=["null", "list", "string", "empty-object", "garbage", "empty",
                              "nesting-bomb", "no-id", "bool-id"])
def test_a_line_that_is_not_a_reply_is_a_protocol_error(raw):
    bad(check("ping", 1, raw), "protocol")


def test_a_reply_to_another_request_is_a_protocol_error():
    assert "not the reply to this request" in bad(check("step", 2, line(STEP, id=1)), "protocol")


@pytest.mark.parametrize("reward,expected", [
    (10**400, "reward"), (2**64, "reward"), (-(2**63) - 1, "reward"),
], ids=["10**400", "2**64", "below-int64"])
def test_ints_beyond_64_bits_are_refused(reward, expected):
    msg = bad(check("step", 1, line(["obs", reward, True, False, {}])))
    assert "more than 64" in msg and expected in msg


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_non_finite_numbers_are_refused(literal):
    raw = b'{"id": 1, "ok": true, "result": ["o", ' + literal + b', true, false, {}], ' \
          b'"shape": ["tuple", 5]}'
    assert "non-finite" in bad(check("step", 1, raw))


def test_a_non_finite_float_the_worker_marked_is_named():
    msg = bad(check("step", 1, line(["o", {"__float__": "nan"}, True, False, {}])))
    assert msg == "step: reward must be a number, got float nan"


def test_lone_surrogates_and_bad_bytes_become_replacement_characters():
    raw = (b'{"id": 1, "ok": true, "result": ["\\ud800 obs \\udfff", 0, false, false, '
           b'{"\\udc80key": ["\\ud83d\\ude00 \xff\xfe \xed\xa0\x80"]}], "shape": ["tuple", 5]}')
    reply = check("step", 1, raw)
    assert reply.ok, reply
    assert reply.result[0] == "\ufffd obs \ufffd"
    assert reply.result[4] == {"\ufffdkey": ["\U0001F600 \ufffd\ufffd \ufffd\ufffd\ufffd"]}
    orjson.dumps(reply.result)  # refuses lone surrogates: this is what shards would hit


def test_surrogates_in_an_error_message_are_replaced():
    reply = check("step", 1, line(ok=False, error={"type": "ValueError",
                                                   "msg": "bad \ud800", "trace": "\udfff"}))
    assert reply.outcome == "program_error"
    assert reply.error == {"type": "ValueError", "msg": "bad \ufffd", "trace": "\ufffd"}
    orjson.dumps(reply.error)


@pytest.mark.parametrize("error", [None, [1], {"type": 1, "msg": "x"}, {"msg": "x"}, "boom"])
def test_a_malformed_error_reply_is_a_bad_reply(error):
    bad(check("step", 1, line(ok=False, error=error)))


def test_error_fields_are_bounded():
    reply = check("step", 1, line(ok=False, error={"type": "T" * 500, "msg": "m" * 10**5,
                                                   "trace": "t" * 10**5, "extra": "x"}))
    assert set(reply.error) == {"type", "msg", "trace"}
    assert all(len(v) <= 4000 for v in reply.error.values())


def test_values_nested_too_deep_are_refused():
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    assert "nested more than" in bad(check("step", 1, line(["o", 0, False, False, {"d": deep}])))


@pytest.mark.parametrize("result,problem", [
    ({"0": "o", "1": {}}, "must return (observation, info), got dict"),
    ("just the observation", "got str"),
    (["o", {}, 3], "got 3 values (str, dict, int)"),
    ([1, {}], "observation must be str, got int"),
    (["o", [1]], "info must be dict, got list"),
    (["o", {"__object__": "Board", "repr": "<Board>"}][::-1], "observation must be str, got Board"),
], ids=["dict-posing-as-tuple", "str", "three", "int-obs", "list-info", "object-obs"])
def test_reset_of_the_wrong_type_is_a_bad_reply(result, problem):
    msg = bad(check("reset", 1, line(result)))
    assert problem in msg, msg


def test_a_shape_that_contradicts_the_result_is_a_bad_reply():
    assert "does not match" in bad(check("reset", 1, line(["o", {}], shape=["dict", 2])))
    assert "does not match" in bad(check("reset", 1, line(["o", {}], shape=["tuple", 3])))
    assert "shape" in bad(check("reset", 1, line(["o", {}], shape=["tuple"])))


@pytest.mark.parametrize("index,value,problem", [
    (0, None, "observation must be str, got NoneType"),
    (1, "1.0", "reward must be a number, got str"),
    (1, True, "reward must be a number, got bool"),
    (2, 1, "terminated must be bool, got int"),
    (3, None, "truncated must be bool, got NoneType"),
    (4, [], "info must be dict, got list"),
])
def test_step_fields_of_the_wrong_type_are_bad_replies(index, value, problem):
    result = list(STEP)
    result[index] = value
    assert bad(check("step", 1, line(result))) == f"step: {problem}"


@pytest.mark.parametrize("result,ok", [
    (["a", "b"], True), ("a\nb", True), ([], True), (["a", 1], False), ({"a": 1}, False),
    (None, False), (42, True), (0.75, True), (True, False),
])
def test_solution_is_a_list_of_str_a_str_or_a_number(result, ok):
    assert check("solution", 1, line(result)).ok is ok


TOOL = {"type": "function", "function": {"name": "look", "description": "d",
                                         "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("result,problem", [
    ({"look": TOOL}, "must return a list of tool schemas, got dict"),
    ([TOOL, "look"], "tool 1 is not"),
    ([{"type": "function", "function": {"name": ""}}], "tool 0 is not"),
    ([{"function": {"name": "x"}}], "tool 0 is not"),
    ([TOOL] * (MAX_TOOLS + 1), f"more than {MAX_TOOLS}"),
    ([{**TOOL, "function": {**TOOL["function"], "description": "x" * 20000}}], "KiB of JSON"),
    ([{**TOOL, "function": {**TOOL["function"], "parameters": {"maximum": 2**64 + 1}}}],
     "more than 64"),
], ids=["dict", "str-tool", "empty-name", "no-type", "too-many", "too-big", "huge-int"])
def test_tools_must_be_a_bounded_list_of_function_schemas(result, problem):
    assert problem in bad(check("tools", 1, line(result)))


def test_good_tools_pass():
    assert check("tools", 1, line([TOOL])).result == [TOOL]


@pytest.mark.parametrize("result,ok", [
    ([False, True, "KeyError: 'x'"], True), ([], True), ([0], False), ("False", False),
])
def test_criteria_are_bools_or_error_strings(result, ok):
    assert check("criteria", 1, line(result)).ok is ok


@pytest.mark.parametrize("result,ok", [
    ({"class_name": "GuessEnv", "domain": "game", "max_turns": 10}, True),
    ({"class_name": "GuessEnv", "domain": "chess", "max_turns": 10}, False),
    ({"domain": "game"}, False),
    ({"class_name": "X", "domain": "game", "max_turns": 2**70}, False),
])
def test_load_facts(result, ok):
    assert check("load", 1, line(result)).ok is ok


def test_ping_must_answer_pong():
    assert check("ping", 1, line("pong")).ok
    bad(check("ping", 1, line("pang")))


def test_mutated_lines_never_raise_and_ok_results_are_writable():
    """A seeded fuzz: random edits of valid replies, checked as every op."""
    rng = random.Random(0)
    seeds = [line(STEP), line(["o", {}]), line([TOOL]), line(["a", "b"]), line([True, "x"]),
             line(ok=False, error={"type": "E", "msg": "m"})]
    alphabet = b'{}[]",:0123456789.eE+-\\u dD8fnulltrueNaInfiy\xff\xed\xa0\x80'
    for _ in range(3000):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(raw))
            edit = rng.choice(("insert", "delete", "replace"))
            if edit == "delete":
                del raw[at]
            else:
                raw[at:at + (edit == "replace")] = bytes([rng.choice(alphabet)])
        for op in ("ping", "load", "reset", "step", "solution", "tools", "criteria", "close"):
            reply = check(op, 1, bytes(raw))
            assert reply.outcome in ("ok", "program_error"), (op, raw)
            orjson.dumps([reply.result, reply.shape, reply.error])
