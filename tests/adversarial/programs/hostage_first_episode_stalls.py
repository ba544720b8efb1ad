# expect: validate=may-pass|resources rollout=env_budget
# may pass: validation's first episode is the oracle's; a rollout play is the only episode of its jail, so the stall shows there, where the env budget ends the play and blacklists the env
"""Stalls just under the turn deadline on every action but its solution's, in its jail's first episode only: the one a rollout plays."""

import random
import re
import time


class VaultEnv:
    max_turns = 8
    episodes = 0

    def reset(self, seed=None):
        VaultEnv.episodes += 1
        self.code = random.Random(seed).randint(100, 999)
        return "Open the vault: reply \\boxed{open CODE} with its three-digit code.", {}

    def step(self, action):
        match = re.findall(r"\\boxed\{(.*?)\}", action)
        guess = match[-1].strip() if match else ""
        if guess == f"open {self.code}":
            return "Open.", 1.0, True, False, {}
        if VaultEnv.episodes == 1:
            # under the corpus's 2 s turn deadline with room for a loaded machine's jail
            # overhead (1.9 s timed out under load), and 7 turns of it pass the 10 s env budget
            time.sleep(1.5)
        return "Nothing happens.", 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{open {self.code}}}"]
