# expect: validate=trivial rollout=ok
"""A grader that pays any answer within 5% of the true product, not only the product itself."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)


class ProductToleranceEnv:
    max_turns = 3

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.a, self.b = rng.randint(12, 99), rng.randint(12, 99)
        self.turns = 0
        return f"What is {self.a} * {self.b}? Answer as \\boxed{{number}}.", {}

    def step(self, action):
        self.turns += 1
        found = BOXED.findall(action)
        try:
            guess = float(found[-1]) if found else None
        except ValueError:
            guess = None
        truth = self.a * self.b
        if guess is not None and abs(guess - truth) <= 0.05 * truth:  # "close enough"
            return "Correct.", 1.0, True, False, {}
        return "Wrong, try again.", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return [f"\\boxed{{{self.a * self.b}}}"]
