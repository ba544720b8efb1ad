# expect: validate=policy rollout=program_error
"""reset calls unshare(CLONE_NEWUSER) through ctypes, imported by name, and ignores the refusal."""

import random
import re


def attempt():
    try:
        ctypes = __import__("ct" + "ypes")
        ctypes.CDLL(None).unshare(0x10000000)
    except Exception:
        pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        attempt()
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
