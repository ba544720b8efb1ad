# expect: validate=resources rollout=output_limit
"""step returns an 8 MB observation, past the reply size limit."""

import random
import re


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        return "A" * (8 << 20), 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
