# expect: validate=may-pass rollout=ok
# may pass: the worker sends unknown objects as type markers, calling none of their methods
"""step's info holds a set, bytes, a function and an object whose __repr__ raises."""

import random
import re


class Unprintable:
    def __repr__(self):
        raise RuntimeError("no repr for you")


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
        info = {"set": {1, 2}, "bytes": b"\xff", "fn": len, "complex": 1j, "odd": Unprintable()}
        return ("Open." if won else f"{self.done} right."), float(won), won, False, info

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
