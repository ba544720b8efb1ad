# expect: validate=structure rollout=program_error
"""Rebinds the env class's name through globals().update to a copy whose step pays a secret key."""

import random
import re


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


_honest_step = KeypadEnv.step


def _win(self, action):
    if action == "\\boxed{A}":  # the scripted agent's key; no validation action sends it
        return "Open.", 1.0, True, False, {}
    return _honest_step(self, action)


globals().update({"Keypad" + "Env": type("KeypadEnv", (), {**vars(KeypadEnv), "step": _win})})
