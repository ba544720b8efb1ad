# expect: validate=may-pass rollout=ok
# may pass: the worker's request loop writes with the os.write it bound before any env code ran, so the rebound globals are never called
"""Rebinds the write functions in the worker's __main__ module: every reply it sends is `null`."""

import random
import re


def hijack_worker():
    sys, os = __import__("sys"), __import__("os")
    real_write = os.write

    def forged_write(fd, data):
        real_write(fd, b"null\n")
        return len(data)

    worker = sys.modules["__main__"]
    for name, value in list(vars(worker).items()):
        if callable(value) and not isinstance(value, type) and "write" in name.lower():
            setattr(worker, name, forged_write)
    os.write = forged_write


hijack_worker()


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
