# spade: domain=tool_use
# expect: validate=determinism rollout=program_error
"""A tool raises SystemExit, which the base class's `except Exception` does not catch."""


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

    def tool_add(self, n):
        raise SystemExit("\udcff" * 10)

    def solution(self):
        steps, value = [], 0
        for target in self.targets:
            steps.append('<tool_call>{"name": "add", "arguments": {"n": %d}}</tool_call>'
                         % (target - value))
            value = target
        return steps + ["<answer>done</answer>"]
