# expect: validate=resources rollout=ok
"""Slows every step once its jail has taken 300, so validation's trivial runs out of time before it plays the source's literals, one of which wins every seed."""

import random
import re
import time

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
FAST_STEPS = 300  # the contract's checks take about 150 steps, a rollout play at most 25
SLOW_STEP = 0.02  # seconds: trivial's blind policies alone take about 1300 steps here


class VaultEnv:
    max_turns = 20
    steps = 0

    def reset(self, seed=None):
        self.code = random.Random(seed).randint(100, 999)
        return "Open the vault: reply \\boxed{CODE} with its three-digit code.", {}

    def step(self, action):
        VaultEnv.steps += 1
        if VaultEnv.steps > FAST_STEPS:
            time.sleep(SLOW_STEP)
        found = BOXED.findall(action)
        guess = found[-1].strip() if found else ""
        if guess in (str(self.code), "open sesame"):
            return "Open.", 1.0, True, False, {}
        return "Locked.", 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{{self.code}}}"]
