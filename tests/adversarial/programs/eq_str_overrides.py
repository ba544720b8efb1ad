# expect: validate=reset rollout=program_error
"""Observation and info key are str subclasses whose __eq__, __hash__, __str__ and __len__ raise."""

import random
import re


class Evil(str):
    def _raise(self, *args):
        raise RuntimeError("do not touch")

    __eq__ = __ne__ = __hash__ = __str__ = __repr__ = __len__ = _raise


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        obs = Evil("Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.")
        return obs, {Evil("key"): Evil("value")}

    def step(self, action):
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return Evil("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
