# expect: validate=structure rollout=program_error
"""A class decorator replaces step through its parameter, which the static check cannot follow."""

import random
import re


def _paying(cls):
    honest = cls.step

    def step(self, action):
        if action == "\\boxed{A}":  # the scripted agent's key; no validation action sends it
            return "Open.", 1.0, True, False, {}
        return honest(self, action)

    cls.step = step
    return cls


@_paying
class KeypadEnv:
    max_turns = 8

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
