# spade: domain=game skill=arithmetic
"""Heaviest sack (starter tier): three sacks, each weighed in parts; name the heaviest.
One turn. The first letter of the answer picks the sack (a, b or c): win 1, a lighter sack 0,
no sack -1."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
SACKS = ("a", "b", "c")


def _first_letter(action):
    """First letter a-z of the last \\boxed{...} (of the whole reply without one), or None."""
    if not isinstance(action, str):
        return None
    found = BOXED.findall(action)
    letters = re.findall(r"[a-z]", (found[-1] if found else action).lower())
    return letters[0] if letters else None


class HeaviestSackEnv:
    max_turns = 1

    def reset(self, seed=None):
        rng = random.Random(seed)
        totals = rng.sample(range(6, 20), 3)  # distinct, so exactly one sack is heaviest
        parts = []
        for total in totals:
            first = rng.randint(1, total - 1)
            parts.append((first, total - first))
        self.heaviest = SACKS[totals.index(max(totals))]
        weighed = "; ".join(f"sack {sack} holds {a} kg and {b} kg"
                            for sack, (a, b) in zip(SACKS, parts))
        return (f"Three sacks: {weighed}. Which sack is heaviest? Answer with its letter, for "
                f"example \\boxed{{a}}."), {}

    def step(self, action):
        pick = _first_letter(action)
        if pick == self.heaviest:
            return f"Sack {pick} is the heaviest. You win.", 1.0, True, False, {}
        if pick in SACKS:
            return f"Sack {pick} is lighter than sack {self.heaviest}.", 0.0, True, False, {}
        return "That names no sack (a, b or c). You lose.", -1.0, True, False, {}

    def solution(self):
        return [f"\\boxed{{{self.heaviest}}}"]
