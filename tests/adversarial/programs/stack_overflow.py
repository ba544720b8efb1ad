# expect: validate=resources|determinism rollout=oom|program_error|timeout
"""step lifts the recursion limit and recurses until the C stack overflows (a segfault)."""

import random


def dive(depth):
    return dive(depth + 1) + 1


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        __import__("sys").setrecursionlimit(10**8)
        return dive(0)

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
