# spade: domain=game skill=memory
"""Coin boxes (starter tier): you watch a coin go into one of three boxes; name that box.
One turn. The first letter of the answer picks the box: win 1, an empty box 0, no box -1."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
BOXES = ("a", "b", "c")


def _first_letter(action):
    """First letter a-z of the last \\boxed{...} (of the whole reply without one), or None."""
    if not isinstance(action, str):
        return None
    found = BOXED.findall(action)
    letters = re.findall(r"[a-z]", (found[-1] if found else action).lower())
    return letters[0] if letters else None


class CoinBoxesEnv:
    max_turns = 1

    def reset(self, seed=None):
        self.coin = random.Random(seed).choice(BOXES)
        return (f"Three closed boxes stand in a row: a, b and c. You watch the coin go into box "
                f"{self.coin}. Which box holds the coin? Answer with its letter, for example "
                f"\\boxed{{a}}."), {}

    def step(self, action):
        pick = _first_letter(action)
        if pick == self.coin:
            return f"Box {pick} holds the coin. You win.", 1.0, True, False, {}
        if pick in BOXES:
            return f"Box {pick} is empty. The coin was in box {self.coin}.", 0.0, True, False, {}
        return "That names no box (a, b or c). You lose.", -1.0, True, False, {}

    def solution(self):
        return [f"\\boxed{{{self.coin}}}"]
