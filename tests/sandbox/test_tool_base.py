"""sandbox/tool_base.py: an env that leaves `self.tools` empty gets its tools from its `tool_<name>`
methods (docstring, signature, annotations), and the agent plays them; an env's own
`self.tools` still wins, and a method it does not list is no tool."""

from typing import Literal, Optional

import pytest

from sandbox.tool_base import ToolUseBaseEnv, param_schema, tools_from_methods


class RecordsEnv(ToolUseBaseEnv):
    max_turns = 6

    def setup(self):
        self.state = {"records": {"r1": "open"}}
        self.instructions = ["Close record r1."]
        self.criteria = [lambda state: state["records"]["r1"] == "closed"]

    def tool_find_record(self, record_id: str) -> str:
        """Look up one record by its id.

        Later paragraphs are for the reader of the code, not the agent."""
        return self.state["records"][record_id]

    def tool_set_status(self, record_id: str, status: Literal["open", "closed"],
                        note: Optional[str] = None, *, notify: bool = False) -> str:
        self.state["records"][record_id] = status
        return f"{record_id} is {status}"

    def _helper(self):
        return "not a tool"

    def solution(self):
        return [self.call("set_status", record_id="r1", status="closed"), self.finish()]


def test_each_tool_method_is_a_tool_described_by_its_docstring_and_signature():
    _, info = RecordsEnv().reset(seed=0)
    assert [tool["function"] for tool in info["tools"]] == [
        {"name": "find_record", "description": "Look up one record by its id.",
         "parameters": {"type": "object", "properties": {"record_id": {"type": "string"}},
                        "required": ["record_id"]}},
        {"name": "set_status", "description": "set status",
         "parameters": {"type": "object", "properties": {
             "record_id": {"type": "string"},
             "status": {"type": "string", "enum": ["open", "closed"]},
             "note": {"type": "string"}, "notify": {"type": "boolean"}},
             "required": ["record_id", "status"]}},
    ]


def test_the_agent_plays_the_derived_tools_and_only_them():
    env = RecordsEnv()
    env.reset(seed=0)
    observation, *_ = env.step('<tool_call>{"name": "helper", "arguments": {}}</tool_call>')
    assert observation.startswith("Error: unknown tool 'helper'")
    observation, reward, terminated, *_ = env.step(env.solution()[0])
    assert observation.startswith("r1 is closed") and reward == 1.0 and not terminated
    assert env.step(env.finish())[1:3] == (1.0, True)


def test_an_env_that_writes_self_tools_keeps_them():
    class ListedEnv(RecordsEnv):
        def setup(self):
            super().setup()
            self.tools = {"find_record": {"description": "Find.", "parameters": {}}}

    env = ListedEnv()
    _, info = env.reset(seed=0)
    assert [tool["function"]["name"] for tool in info["tools"]] == ["find_record"]
    observation, *_ = env.step(env.solution()[0])
    assert observation.startswith("Error: unknown tool 'set_status'")


def test_self_tools_that_is_not_a_dict_says_what_to_do():
    class ListedEnv(RecordsEnv):
        def setup(self):
            super().setup()
            self.tools = [{"name": "find_record"}]

    with pytest.raises(TypeError, match="self.tools is a list: leave it out"):
        ListedEnv().reset(seed=0)


def test_a_subclass_method_replaces_its_base_and_keeps_its_place():
    class Renamed(RecordsEnv):
        def tool_find_record(self, record_id: int) -> str:
            """Find by number."""
            return "found"

        @staticmethod
        def tool_count(kind: list) -> str:
            return "0"

    tools = tools_from_methods(Renamed)
    assert list(tools) == ["find_record", "set_status", "count"]
    assert tools["find_record"]["parameters"]["properties"] == {"record_id": {"type": "integer"}}
    assert tools["count"]["parameters"]["required"] == ["kind"]


def test_annotations_written_as_text_and_unknown_ones():
    assert param_schema("Literal['a', \"b\"]") == {"type": "string", "enum": ["a", "b"]}
    assert param_schema("Optional[float]") == {"type": "number"}
    assert param_schema("list[str]") == {"type": "array"}
    assert param_schema("int | None") == {"type": "integer"}
    assert param_schema(int | None) == {"type": "integer"}
    assert param_schema(Literal[1, 2]) == {"type": "integer", "enum": [1, 2]}
    assert param_schema(Literal["x", 2]) == {"enum": ["x", 2]}
    assert param_schema(None) == {} and param_schema("SomeClass") == {} and param_schema(3) == {}
