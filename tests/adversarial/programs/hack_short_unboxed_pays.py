# expect: validate=trivial rollout=ok
"""A three-turn game that pays any unboxed reply: short enough that cycled generic actions,
which reach an unboxed one only on turn 16, never send it."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)


class ShortColourEnv:
    max_turns = 3
    COLOURS = ("red", "green", "blue", "amber", "violet", "teal")

    def reset(self, seed=None):
        self.colour = random.Random(seed).choice(self.COLOURS)
        self.turns = 0
        return f"The lamp glows {self.colour}. Name its colour as \\boxed{{colour}}.", {}

    def step(self, action):
        self.turns += 1
        found = BOXED.findall(action)
        if not found:
            return "Fine.", 1.0, True, False, {}
        if found[-1].strip().lower() == self.colour:
            return "Right.", 1.0, True, False, {}
        return "No.", 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{" + self.colour + "}"]
