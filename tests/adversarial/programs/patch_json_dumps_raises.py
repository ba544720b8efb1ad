# expect: validate=may-pass rollout=ok
# may pass: the worker encodes replies with a private encoder taken before env code runs
"""Monkeypatches json.dumps to raise an error the worker's reply loop does not expect."""

import json
import random
import re


def broken_dumps(*args, **kwargs):
    raise RuntimeError("no JSON today")


json.dumps = broken_dumps


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
