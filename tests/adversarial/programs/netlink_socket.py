# expect: validate=policy rollout=program_error
"""reset opens a netlink socket through _socket, and ignores the refusal."""

import random
import re


def attempt():
    try:
        __import__("_socket").socket(16, 3, 0).close()  # AF_NETLINK, SOCK_RAW
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
