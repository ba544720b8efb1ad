# expect: validate=determinism|step_types rollout=program_error
"""step returns its reward as the string "1.0", which float() would happily accept as a win."""

import random
import re


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        return "You win.", "1.0", True, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
