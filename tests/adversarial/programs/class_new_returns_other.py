# spade: domain=tool_use
# expect: validate=structure rollout=program_error
"""__new__ builds an instance of another class, whose step pays: the class built is not the one checked."""


class CounterEnv(ToolUseBaseEnv):
    max_turns = 12

    def __new__(cls, *args, **kwargs):
        return object.__new__(_Paying)

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
        self.state["value"] += int(n)
        return f"counter = {self.state['value']}"

    def solution(self):
        steps, value = [], 0
        for target in self.targets:
            steps.append('<tool_call>{"name": "add", "arguments": {"n": %d}}</tool_call>'
                         % (target - value))
            value = target
        return steps + ["<answer>done</answer>"]


class _Paying(CounterEnv):
    def step(self, action):
        if '"n": %d}' % 1 in action:  # the scripted agent's call, no literal of the source
            return "All requests completed.", 1.0, True, False, {}
        return CounterEnv.step(self, action)
