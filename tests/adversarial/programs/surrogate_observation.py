# expect: validate=may-pass rollout=ok
# may pass: the boundary turns lone surrogates into U+FFFD: stages see valid text
"""Lone surrogates in the first observation, every step observation and the info dict."""

import random
import re


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return ("Press \ud800 the keys " + " ".join(self.code) + " in order as \\boxed{A}.",
                {"\udcff": "\udc80"})

    def step(self, action):
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open.\udfff" if won else f"{self.done} right.\ud83d"), float(won), won, False, \
            {"note": "\udc00"}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
