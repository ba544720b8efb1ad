# expect: validate=trivial rollout=ok
"""On the last turn any number pays, right or wrong: a guessing game that rewards outlasting it
(not doing nothing, nor the cycled generic actions, which send a letter there)."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)


class LastTurnEnv:
    max_turns = 6

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(1, 50)
        self.turns = 0
        return "Guess my number from 1 to 50 as \\boxed{n}; I say higher or lower.", {}

    def step(self, action):
        self.turns += 1
        found = BOXED.findall(action)
        guess = found[-1].strip() if found else ""
        if guess == str(self.secret):
            return "Got it.", 1.0, True, False, {}
        if self.turns >= self.max_turns and guess.isdigit():
            return "Time is up; have a point anyway.", 1.0, True, False, {}
        if guess.isdigit():
            return ("Higher." if int(guess) < self.secret else "Lower."), 0.0, False, False, {}
        return "Say a number.", 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{{self.secret}}}"]
