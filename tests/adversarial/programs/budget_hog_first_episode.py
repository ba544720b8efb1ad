# expect: validate=may-pass rollout=ok|env_budget
# may pass: validation never steps a jail's first episode; a rollout play is the only episode of its jail, and once four plays of the env have used more than a quarter of their env budgets on average the rest are cut and the env is blacklisted
"""Spends a second on every action but its solution's in its jail's first episode only, most of a play's env budget without ever running out of it."""

import random
import re
import time

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)


class SlowVaultEnv:
    max_turns = 8
    episodes = 0

    def reset(self, seed=None):
        SlowVaultEnv.episodes += 1
        self.code = random.Random(seed).randint(100, 999)
        return "Open the vault: reply \\boxed{open CODE} with its three-digit code.", {}

    def step(self, action):
        found = BOXED.findall(action)
        guess = found[-1].strip() if found else ""
        if guess == f"open {self.code}":
            return "Open.", 1.0, True, False, {}
        if SlowVaultEnv.episodes == 1:
            time.sleep(1.0)  # under the corpus's 2 s turn deadline and, 8 turns, its 10 s budget
        return "Nothing happens.", 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{open {self.code}}}"]
