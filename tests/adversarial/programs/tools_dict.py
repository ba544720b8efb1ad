# spade: domain=tool_use
# expect: validate=structure rollout=program_error|ok
"""get_tools(), rebound on the instance by setup(), returns a dict of schemas instead of a list."""


class CounterEnv(ToolUseBaseEnv):
    max_turns = 12

    def setup(self):
        self.targets = [self.rng.randint(5, 9), self.rng.randint(12, 15), self.rng.randint(1, 4)]
        self.state = {"value": 0}
        self.tools = {"add": {"description": "Add an integer to the counter.",
                              "parameters": {"type": "object",
                                             "properties": {"n": {"type": "integer"}},
                                             "required": ["n"]}}}
        self.instructions = [f"Make the counter exactly {t}." for t in self.targets]
        self.criteria = [lambda s, t=t: s["value"] == t for t in self.targets]
        # on the instance, where neither the class checks nor the worker's guard look
        self.get_tools = lambda: tools_as_dict(self)

    def tool_add(self, n):
        self.state["value"] += int(n)
        return f"counter = {self.state['value']}"

    def solution(self):
        steps, value = [], 0
        for target in self.targets:
            steps.append('<tool_call>{"name": "add", "arguments": {"n": %d}}</tool_call>'
                         % (target - value))
            value = target
        return steps + ["<answer>done</answer>"]


def tools_as_dict(self):
    return {"add": {"type": "function", "function": {"name": "add", **self.tools["add"]}}}

