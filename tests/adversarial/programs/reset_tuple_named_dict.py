# expect: validate=reset rollout=program_error
"""reset returns an instance of a dict subclass named `tuple`: the reply's shape claims a tuple."""

import random
import re


class tuple(dict):
    pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return tuple({"obs": "Press " + " ".join(self.code) + " as \\boxed{A}.", "info": {}})

    def step(self, action):
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
