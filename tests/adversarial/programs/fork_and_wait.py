# expect: validate=policy rollout=program_error
"""reset forks a child that exits at once, and waits for it."""

import random
import re


def attempt():
    os = __import__("os")
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


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
