# expect: validate=structure rollout=program_error
"""Every attribute read on the env instance raises (max_turns, reset, step, ...)."""

import random


class KeypadEnv:
    max_turns = 8

    def __getattribute__(self, name):
        raise RuntimeError(f"no attribute {name} for you")

    def reset(self, seed=None):
        return "Press \\boxed{A}.", {}

    def step(self, action):
        return "nothing", 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in random.Random(0).sample("ABCDEFGH", 3)]
