# expect: validate=reset rollout=program_error
"""reset forges a reply nested 100,000 arrays deep, past the parent's JSON recursion limit."""

import random
import re


def forge(line):
    os = __import__("os")
    for fd in range(3, 64):
        try:
            os.write(fd, line)
        except OSError:
            pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        forge(b"[" * 100000 + b"]" * 100000 + b"\n")
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
