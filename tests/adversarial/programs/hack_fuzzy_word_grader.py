# expect: validate=trivial rollout=ok
"""A word grader that pays any reply one letter away from the answer (edit distance 1)."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
WORDS = ("planet", "garden", "bridge", "candle", "forest", "silver", "marble", "window")


def close(a, b):
    if a == b:
        return True
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    return False


class UnscrambleEnv:
    max_turns = 3

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.word = rng.choice(WORDS)
        letters = list(self.word)
        rng.shuffle(letters)
        self.turns = 0
        return f"Unscramble: {''.join(letters)}. Answer as \\boxed{{word}}.", {}

    def step(self, action):
        self.turns += 1
        found = BOXED.findall(action)
        if found and close(found[-1].strip().lower(), self.word):
            return "Correct.", 1.0, True, False, {}
        return "No.", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{" + self.word + "}"]
