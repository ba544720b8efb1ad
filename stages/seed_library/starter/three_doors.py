# spade: domain=game skill=spatial
"""Three doors (starter tier): three doors in a row, daylight under one; name the door that
leads outside. One turn. The first letter of the answer picks the door (a, b or c): win 1,
another door 0, no door -1."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
DOORS = {"a": "left", "b": "middle", "c": "right"}


def _first_letter(action):
    """First letter a-z of the last \\boxed{...} (of the whole reply without one), or None."""
    if not isinstance(action, str):
        return None
    found = BOXED.findall(action)
    letters = re.findall(r"[a-z]", (found[-1] if found else action).lower())
    return letters[0] if letters else None


class ThreeDoorsEnv:
    max_turns = 1

    def reset(self, seed=None):
        self.exit = random.Random(seed).choice(sorted(DOORS))
        return (f"Three doors stand in a row: a on the left, b in the middle, c on the right. "
                f"Daylight shows under the {DOORS[self.exit]} one. Which door leads outside? "
                f"Answer with its letter, for example \\boxed{{a}}."), {}

    def step(self, action):
        pick = _first_letter(action)
        if pick == self.exit:
            return f"Door {pick} opens onto the garden. You win.", 1.0, True, False, {}
        if pick in DOORS:
            return (f"Door {pick} opens onto a cupboard. The way out was door "
                    f"{self.exit}."), 0.0, True, False, {}
        return "That names no door (a, b or c). You lose.", -1.0, True, False, {}

    def solution(self):
        return [f"\\boxed{{{self.exit}}}"]
