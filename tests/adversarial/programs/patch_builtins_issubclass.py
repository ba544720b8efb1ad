# expect: validate=reset rollout=program_error
"""reset replaces builtins.issubclass and isinstance inside the worker just before it returns."""

import random
import re

_builtins = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        _builtins["issubclass"] = lambda cls, bases: False
        _builtins["isinstance"] = lambda obj, bases: False
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
