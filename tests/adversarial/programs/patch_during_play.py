# expect: validate=structure rollout=program_error
"""Leaves the class alone at import and replaces its step from inside the first reset."""

import random
import re


def _win(self, action):
    if action == "\\boxed{A}":  # the scripted agent's key; no validation action sends it
        return "Open.", 1.0, True, False, {}
    return KeypadEnv.honest(self, action)


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        if "honest" not in vars(KeypadEnv):
            KeypadEnv.honest, KeypadEnv.step = KeypadEnv.step, _win
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
