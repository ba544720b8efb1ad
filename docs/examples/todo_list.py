# spade: domain=tool_use skill=state-modification
"""To-do list: add a task at a priority, mark another done and delete a third, one request at a
time."""

import json
from typing import Literal

TASKS = ["buy milk", "call the bank", "water the plants", "book the dentist", "pay the rent",
         "fix the bike", "renew the passport", "send the invoice"]


class TodoListEnv(ToolUseBaseEnv):
    max_turns = 10

    def setup(self):
        done, drop, keep, new = self.rng.sample(TASKS, 4)
        priority = self.rng.choice(["low", "high"])
        self.state = {"tasks": {done: "open", drop: "open", keep: "open"}, "priority": {}}
        self.instructions = [f"Add the task '{new}' with {priority} priority.",
                             f"Mark '{done}' as done.", f"Delete the task '{drop}'."]
        self.criteria = [lambda s: s["priority"].get(new) == priority,
                         lambda s: s["tasks"].get(done) == "done",
                         lambda s: drop not in s["tasks"]]
        self.plan = [("add_task", {"name": new, "priority": priority}),
                     ("complete_task", {"name": done}), ("delete_task", {"name": drop})]

    # each tool_<name> method is a tool: the agent sees its docstring and its typed parameters
    def tool_list_tasks(self) -> str:
        """List every task with its status."""
        return json.dumps(self.state["tasks"])

    def tool_add_task(self, name: str, priority: Literal["low", "normal", "high"] = "normal"):
        """Add an open task."""
        if name in self.state["tasks"]:
            raise ValueError(f"'{name}' is already on the list")
        self.state["tasks"][name] = "open"
        self.state["priority"][name] = priority
        return f"Added '{name}' ({priority} priority)."

    def tool_complete_task(self, name: str) -> str:
        """Mark a task as done."""
        self._existing(name)
        self.state["tasks"][name] = "done"
        return f"'{name}' is done."

    def tool_delete_task(self, name: str) -> str:
        """Remove a task from the list."""
        self._existing(name)
        del self.state["tasks"][name]
        return f"Deleted '{name}'."

    def _existing(self, name):
        if name not in self.state["tasks"]:
            raise ValueError(f"no task called '{name}'; call list_tasks to see them")

    def solution(self):
        return [self.call(tool, **arguments) for tool, arguments in self.plan] + [self.finish()]
