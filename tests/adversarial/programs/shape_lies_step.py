# expect: validate=determinism|step_types rollout=program_error
"""step returns a 2-item list subclass named `tuple` whose __len__ says 5: the shape lies."""

import random
import re


class tuple(list):
    def __len__(self):
        return 5


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        return tuple(["nothing happens", 0.0])

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
