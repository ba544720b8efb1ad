# expect: validate=determinism rollout=program_error
"""step raises an exception whose message holds lone surrogates (unencodable as UTF-8)."""

import random


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        raise ValueError("bad key \udcff\ud800\udfff" + "\udc80" * 600)

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
