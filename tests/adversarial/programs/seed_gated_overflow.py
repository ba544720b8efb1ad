# expect: validate=determinism|step_types rollout=program_error
"""Behaves on the validator's usual seeds; on any other seed every reward is 10**400."""

import random
import re

KNOWN_SEEDS = {0, 1, 2, 3, 4, 5, 6, 7, 42, 123}


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.hostile = seed not in KNOWN_SEEDS
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        reward = 10**400 if self.hostile else float(won)
        return ("Open." if won else f"{self.done} right."), reward, won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
