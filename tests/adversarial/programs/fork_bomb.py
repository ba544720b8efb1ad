# expect: validate=policy|resources rollout=program_error|timeout
"""From its second step on, forks as fast as it can and every process spins."""

import random
import re


class KeypadEnv:
    max_turns = 8
    steps = 0

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        KeypadEnv.steps += 1
        if KeypadEnv.steps > 1:
            os = __import__("os")
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
