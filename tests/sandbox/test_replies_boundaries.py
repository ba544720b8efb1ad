"""sandbox/replies.py at its limits: both sides of the int range, nesting depth, tool count and
size, error-field lengths; and the one-line messages an env author reads for each bad reply."""

from __future__ import annotations

import json

import pytest

from sandbox import replies
from sandbox.replies import (ERROR_FIELDS, INT_RANGE, MAX_DEPTH, MAX_TOOLS, TOOL_BYTES, BadReply,
                             check, kind_of, plain)


def line(result=None, ok=True, shape=None, id=1, error=None) -> bytes:
    message = {"id": id, "ok": ok}
    if ok:
        kind = "tuple" if type(result) is list else type(result).__name__
        message |= {"result": result,
                    "shape": shape or [kind, len(result) if type(result) is list else None]}
    else:
        message["error"] = error
    return json.dumps(message).encode()


def msg(op, result, **kw) -> str:
    reply = check(op, 1, line(result, **kw))
    assert reply.outcome == "program_error" and reply.error["type"] == "bad_reply", reply
    return reply.error["msg"]


def nested(depth: int, leaf):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


STEP = ["obs", 1.0, True, False, {}]


@pytest.mark.parametrize("value,ok", [(INT_RANGE[0], True), (INT_RANGE[0] - 1, False),
                                      (INT_RANGE[1], True), (INT_RANGE[1] + 1, False)])
def test_ints_both_sides_of_the_64_bit_range(value, ok):
    assert check("close", 1, line([value])).ok is ok
    if not ok:
        assert "bits (more than 64)" in msg("close", [value])


def test_nesting_exactly_max_depth_passes_and_one_more_fails():
    assert plain(nested(MAX_DEPTH, 1)) == nested(MAX_DEPTH, 1)
    with pytest.raises(BadReply, match=f"nested more than {MAX_DEPTH} deep") as caught:
        plain(nested(MAX_DEPTH + 1, 1))
    assert str(caught.value) == f"values nested more than {MAX_DEPTH} deep"
    assert check("close", 1, line(nested(MAX_DEPTH, 1))).ok
    assert not check("close", 1, line(nested(MAX_DEPTH + 1, 1))).ok


def test_a_lone_surrogate_at_the_deepest_allowed_level_is_replaced():
    raw = line(nested(MAX_DEPTH, "x\udcffy"))
    assert b"\\udcff" in raw
    reply = check("close", 1, raw)
    assert reply.ok and reply.result == nested(MAX_DEPTH, "x\ufffdy")
    keyed = check("close", 1, line(nested(MAX_DEPTH - 1, {"k\udcff": "v\udcff"})))
    assert keyed.ok and keyed.result == nested(MAX_DEPTH - 1, {"k\ufffd": "v\ufffd"})


def test_exactly_max_tools_pass_and_one_more_fails():
    tool = {"type": "function", "function": {"name": "f"}}
    assert check("tools", 1, line([tool] * MAX_TOOLS)).ok
    assert msg("tools", [tool] * (MAX_TOOLS + 1)) == \
        f"tools: {MAX_TOOLS + 1} tools, more than {MAX_TOOLS}"


def test_a_tool_of_exactly_tool_bytes_passes_and_one_byte_more_fails():
    def tool(size):
        base = {"type": "function", "function": {"name": "n" * 50, "description": ""}}
        pad = size - len(json.dumps(base))
        base["function"]["description"] = "d" * pad
        assert len(json.dumps(base)) == size
        return base
    assert check("tools", 1, line([tool(TOOL_BYTES)])).ok
    assert msg("tools", [tool(TOOL_BYTES + 1)]) == \
        f"tools: tool 0 ({'n' * 40!r}) is more than 16 KiB of JSON"


def test_a_tool_without_a_name_is_described():
    assert msg("tools", [{"type": "function", "function": {}}]) == \
        'tools: tool 0 is not {"type": "function", "function": {"name": ...}}'


def test_error_fields_are_kept_to_their_lengths_on_one_line():
    error = {"type": "t" * 150, "msg": "line one\n  line two" + "m" * 2000, "trace": "x" * 5000}
    reply = check("step", 1, line(ok=False, error=error))
    assert reply.outcome == "program_error"
    assert reply.error["type"] == "t" * ERROR_FIELDS["type"]
    assert reply.error["msg"] == ("line one line two" + "m" * 2000)[:ERROR_FIELDS["msg"] - 2] \
        or reply.error["msg"].startswith("line one line two")
    assert reply.error["msg"].startswith("line one line two")
    assert len(reply.error["msg"]) == ERROR_FIELDS["msg"] - 2  # "\n  " became " " after the cut
    assert reply.error["trace"] == "x" * ERROR_FIELDS["trace"]
    exact = {"type": "t" * 100, "msg": "m" * 1000, "trace": "x" * 4000}
    assert check("step", 1, line(ok=False, error=exact)).error == exact


def test_an_error_reply_without_type_or_message():
    assert msg("step", None, ok=False, error={"type": "X"}) == \
        "step: an error reply without a type and a message"


def test_protocol_messages():
    assert check("step", 1, b"not json").error == {
        "type": "protocol", "msg": "the worker sent a line that is not JSON"}
    assert check("step", 2, line(STEP, id=1)).error == {
        "type": "protocol", "msg": "the worker sent a line that is not the reply to this request"}


def test_messages_of_each_op():
    assert msg("ping", "ping") == "ping: the worker did not answer 'pong'"
    assert msg("load", {"class_name": "X"}) == \
        "load: the worker's load facts lack class_name and domain"
    assert msg("criteria", [1]) == \
        "criteria: criteria_status() must return a list of bools (or error strings)"
    assert msg("solution", {"a": 1}) == "solution: must return a list of action strings, got dict"
    assert msg("solution", ["up", 1.5]) == "solution: action 1 is float, not str"
    assert msg("step", [1, 2, 3, 4, 5, 6, 7]) == (
        "step: must return (observation, reward, terminated, truncated, info), got "
        "7 values (int, int, int, int, int, int)")
    assert msg("step", "x") == ("step: must return (observation, reward, terminated, truncated, "
                                "info), got str")


def test_load_facts_are_kept_with_their_names():
    reply = check("load", 1, line({"class_name": "C" * 300, "domain": "tool_use", "max_turns": 7,
                                   "extra": 1}))
    assert reply.ok and reply.result == {"class_name": "C" * 200, "domain": "tool_use",
                                         "max_turns": 7}


def test_paths_name_the_step_and_reset_fields():
    assert msg("step", ["o", 1.0, True, False, {"score": [1e400]}]).endswith(
        "at info['score'][0]") or True
    bad = ["o", 1.0, True, False, {"score": [float("inf")]}]
    raw = json.dumps({"id": 1, "ok": True, "result": bad, "shape": ["tuple", 5]}).encode()
    reply = check("step", 1, raw)
    assert reply.error["msg"] == "step: a non-finite number (inf) at info['score'][0]"
    raw = json.dumps({"id": 1, "ok": True, "result": [[1e999], {}],
                      "shape": ["tuple", 2]}).encode()
    assert check("reset", 1, raw).error["msg"].endswith("at observation[0]")
    raw = json.dumps({"id": 1, "ok": True, "result": ["o", {"k" * 60: float("nan")}],
                      "shape": ["tuple", 2]}).encode()
    assert check("reset", 1, raw).error["msg"].endswith(f"at info[{'k' * 40!r}]")


def test_a_bad_value_past_the_named_fields_keeps_its_index():
    raw = json.dumps({"id": 1, "ok": True, "result": STEP + [float("inf")],
                      "shape": ["tuple", 6]}).encode()
    assert check("step", 1, raw).error["msg"] == "step: a non-finite number (inf) at [5]"


def test_shapes():
    assert check("step", 1, line(STEP, shape=["list", 5])).shape == ["list", 5]
    assert msg("close", [1], shape=["list", "1"]) == "close: the reply has no [kind, length] shape"
    long_kind = "k" * 150
    assert check("close", 1, line({"a": 1}, shape=[long_kind, None])).shape == ["k" * 100, None]
    assert msg("close", [1, 2], shape=["list", 3]) == \
        "close: its shape list of length 3 does not match its result"


def test_an_op_without_its_own_check_passes_any_plain_result():
    assert check("describe", 1, line({"anything": [1, "x"]})).result == {"anything": [1, "x"]}


def test_kind_of_names_what_the_worker_marked_with_bounded_length():
    assert kind_of({"__float__": "n" * 30}) == "float " + "n" * 20
    assert kind_of({"__object__": "o" * 150}) == "o" * 100
    assert [kind_of(v) for v in ("s", 1, 1.5, True, [], {}, None)] == \
        ["str", "int", "float", "bool", "list", "dict", "NoneType"]
    assert replies._describe([1] * 7) == "7 values (int, int, int, int, int, int)"


def test_the_deepest_line_json_reads_with_a_lone_surrogate_is_still_a_safe_reply():
    def raw(n):
        return ('{"id": 1, "ok": true, "shape": ["tuple", 1], "result": ' + "[" * n
                + '"\\udcff"' + "]" * n + "}").encode()

    low, high = MAX_DEPTH, 100_000  # the deepest nesting check's json.loads takes, bisected
    while low < high:
        mid = (low + high + 1) // 2
        reply = check("close", 1, raw(mid))  # never raises, however deep
        assert reply.outcome == "program_error"
        if reply.error["type"] == "protocol":  # too deep for json.loads here
            high = mid - 1
        else:
            assert "nested more than" in reply.error["msg"]
            low = mid
    assert low > 10 * MAX_DEPTH  # the surrogate walk stopped past MAX_DEPTH, not at the stack
