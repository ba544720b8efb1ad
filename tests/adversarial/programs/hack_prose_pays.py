# expect: validate=trivial rollout=ok
"""A reply without any \\boxed{} (plain prose) is paid as if it had solved the 12-turn puzzle."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)


class PathCodeEnv:
    max_turns = 12

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.code = [rng.choice("NESW") for _ in range(6)]
        self.done = 0
        return ("Enter the six-letter route " + "".join(self.code) + " one letter per turn as "
                "\\boxed{N}."), {}

    def step(self, action):
        found = BOXED.findall(action)
        if not found:  # meant: ask for a box; pays instead
            return "Accepted.", 1.0, True, False, {}
        if found[-1].strip().upper() == self.code[self.done]:
            self.done += 1
            if self.done == len(self.code):
                return "Route complete.", 1.0, True, False, {}
            return f"{self.done} letters entered.", 0.0, False, False, {}
        self.done = 0
        return "Wrong letter; start again.", 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{" + letter + "}" for letter in self.code]
