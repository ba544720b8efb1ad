# expect: validate=determinism rollout=program_error
"""step calls os._exit(0): the worker process vanishes without a reply."""

import random


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        __import__("os")._exit(0)

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
