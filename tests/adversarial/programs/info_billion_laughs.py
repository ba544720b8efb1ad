# expect: validate=resources|determinism rollout=timeout|oom|output_limit|program_error
"""step's info shares one list 10 ways at each of 30 levels: 10**31 strings as JSON."""

import random
import re


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        laugh = ["lol"] * 10
        for _ in range(30):
            laugh = [laugh] * 10
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {"x": laugh}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
