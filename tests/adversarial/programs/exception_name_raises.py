# expect: validate=determinism rollout=program_error
"""step raises an exception whose class's __name__ (via its metaclass) raises when read."""

import random


class NamelessMeta(type):
    @property
    def __name__(cls):
        raise RuntimeError("nameless")


class Nameless(Exception, metaclass=NamelessMeta):
    pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        raise Nameless("boom")

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
