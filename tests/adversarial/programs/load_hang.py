# expect: validate=resources rollout=timeout
"""The module spins forever at import time, before any class exists."""

import random

while True:
    pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        return "Press \\boxed{A}.", {}

    def step(self, action):
        return "nothing", 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in random.Random(0).sample("ABCDEFGH", 3)]
