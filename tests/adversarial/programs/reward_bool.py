# expect: validate=determinism|step_types rollout=program_error
"""step returns the bool True as its reward, which float() would count as a win."""

import random
import re


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        return "You win.", True, True, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
