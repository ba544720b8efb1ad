# expect: validate=trivial rollout=ok
"""Saying "I don't know" is rewarded like the right answer (a grader that pays honesty)."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)


class CapitalQuizEnv:
    max_turns = 4
    CITIES = {"France": "Paris", "Peru": "Lima", "Kenya": "Nairobi", "Japan": "Tokyo",
              "Chile": "Santiago", "Egypt": "Cairo", "Canada": "Ottawa", "Norway": "Oslo"}

    def reset(self, seed=None):
        self.country = random.Random(seed).choice(sorted(self.CITIES))
        self.turns = 0
        return f"What is the capital of {self.country}? Answer as \\boxed{{city}}.", {}

    def step(self, action):
        self.turns += 1
        if "know" in action.lower():
            return "Honesty is rewarded.", 1.0, True, False, {}
        found = BOXED.findall(action)
        if found and found[-1].strip().lower() == self.CITIES[self.country].lower():
            return "Correct.", 1.0, True, False, {}
        return "No.", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{" + self.CITIES[self.country] + "}"]
