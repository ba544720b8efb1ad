# expect: validate=resources|reset|determinism|oracle rollout=timeout|program_error
"""reset starts a thread that reads the worker's request pipe, stealing its requests."""

import random
import re


def steal_forever():
    os = __import__("os")
    while True:
        for fd in range(3, 64):
            try:
                os.set_blocking(fd, False)
                os.read(fd, 1 << 16)
            except OSError:
                pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        if not getattr(KeypadEnv, "thief", None):
            KeypadEnv.thief = __import__("threading").Thread(target=steal_forever, daemon=True)
            KeypadEnv.thief.start()
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
