# expect: validate=policy rollout=program_error
"""Every step SIGKILLs its parent and every process it can see, then plays on."""

import random
import re


def kill_everyone():
    os, signal = __import__("os"), __import__("signal")
    for target in (lambda: os.kill(os.getppid(), signal.SIGKILL),
                   lambda: os.kill(-1, signal.SIGKILL),
                   lambda: os.kill(1, signal.SIGTERM)):
        try:
            target()
        except OSError:
            pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        kill_everyone()
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
