# expect: validate=determinism rollout=program_error
"""step raises an exception whose __str__ itself raises, inside the worker's error handler."""

import random


class Sneaky(Exception):
    def __str__(self):
        raise RuntimeError("you cannot print me")


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        raise Sneaky()

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
