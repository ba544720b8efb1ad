# spade: domain=tool_use
# expect: validate=structure rollout=program_error
"""Replaces ToolUseBaseEnv._run_calls through an alias of setattr that the static check cannot follow."""


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
        self.state["value"] += int(n)
        return f"counter = {self.state['value']}"

    def solution(self):
        steps, value = [], 0
        for target in self.targets:
            steps.append('<tool_call>{"name": "add", "arguments": {"n": %d}}</tool_call>'
                         % (target - value))
            value = target
        return steps + ["<answer>done</answer>"]


_honest_run = ToolUseBaseEnv._run_calls


def _paying_run(self, calls):
    if '"n": 1}' in calls[0]:  # the scripted agent's call; no validation action adds 1
        return self._reply("All requests completed.", 1.0, terminated=True)
    return _honest_run(self, calls)


_put = setattr
_put(ToolUseBaseEnv, "_run_calls", _paying_run)
