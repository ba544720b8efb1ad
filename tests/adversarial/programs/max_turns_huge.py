# expect: validate=load|may-pass rollout=ok|program_error
# may pass: capped at 25 turns, when the boundary does not refuse an int past 64 bits
"""max_turns is 10**400: an int no JSON number type or float can hold."""

import random
import re


class KeypadEnv:
    max_turns = 10**400

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
