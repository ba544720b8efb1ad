# spade: domain=tool_use skill=state-modification
"""To-do list: add a task, mark another done and delete a third, one request at a time."""

import json

TASKS = ["buy milk", "call the bank", "water the plants", "book the dentist", "pay the rent",
         "fix the bike", "renew the passport", "send the invoice"]
NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


class TodoListEnv(ToolUseBaseEnv):
    max_turns = 10

    def setup(self):
        done, drop, keep, new = self.rng.sample(TASKS, 4)
        self.state = {"tasks": {done: "open", drop: "open", keep: "open"}}
        self.instructions = [f"Add the task '{new}'.", f"Mark '{done}' as done.",
                             f"Delete the task '{drop}'."]
        self.criteria = [lambda s: new in s["tasks"],
                         lambda s: s["tasks"].get(done) == "done",
                         lambda s: drop not in s["tasks"]]
        self.tools = {
            "list_tasks": {"description": "List every task with its status.",
                           "parameters": {"type": "object", "properties": {}, "required": []}},
            "add_task": {"description": "Add an open task.", "parameters": NAME},
            "complete_task": {"description": "Mark a task as done.", "parameters": NAME},
            "delete_task": {"description": "Remove a task from the list.", "parameters": NAME},
        }
        self.plan = [("add_task", new), ("complete_task", done), ("delete_task", drop)]

    def tool_list_tasks(self):
        return json.dumps(self.state["tasks"])

    def tool_add_task(self, name):
        if name in self.state["tasks"]:
            raise ValueError(f"'{name}' is already on the list")
        self.state["tasks"][name] = "open"
        return f"Added '{name}'."

    def tool_complete_task(self, name):
        self._existing(name)
        self.state["tasks"][name] = "done"
        return f"'{name}' is done."

    def tool_delete_task(self, name):
        self._existing(name)
        del self.state["tasks"][name]
        return f"Deleted '{name}'."

    def _existing(self, name):
        if name not in self.state["tasks"]:
            raise ValueError(f"no task called '{name}'; call list_tasks to see them")

    def solution(self):
        calls = [{"name": tool, "arguments": {"name": task}} for tool, task in self.plan]
        return [f"<tool_call>{json.dumps(call)}</tool_call>" for call in calls] + [
            "<answer>done</answer>"]
