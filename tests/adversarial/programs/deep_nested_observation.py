# expect: validate=reset rollout=program_error
"""reset returns an observation that is a list nested 200,000 levels deep."""

import random


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        obs = []
        for _ in range(200000):
            obs = [obs]
        return obs, {}

    def step(self, action):
        return "nothing", 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
