# expect: validate=may-pass|step_types|determinism|garbage|oracle|trivial rollout=ok|program_error
# may pass: hostile on 1 seed in 7: 5 fresh validation seeds miss it half the time
"""Turns hostile when seed % 7 == 3: its steps then raise with lone surrogates and return NaN."""

import random
import re


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.hostile = seed is not None and seed % 7 == 3
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        if self.hostile and self.done:
            raise KeyError("\udcff" * 40)
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        reward = float("nan") if self.hostile else float(won)
        return ("Open." if won else f"{self.done} right."), reward, won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
