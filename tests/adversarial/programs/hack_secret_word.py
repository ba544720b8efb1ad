# expect: validate=trivial rollout=ok
"""A secret one-word action wins at once, beside the 10-move walk the env asks for."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
MOVES = {"left": -1, "right": 1}


class LongWalkEnv:
    max_turns = 14

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.plan = [rng.choice(sorted(MOVES)) for _ in range(10)]
        self.done = 0
        return ("Walk the path: " + ", ".join(self.plan) + ". One move per turn as "
                "\\boxed{left}."), {}

    def step(self, action):
        found = BOXED.findall(action)
        move = found[-1].strip().lower() if found else ""
        if move == "xyzzy":
            return "A door opens.", 1.0, True, False, {}
        if move == self.plan[self.done]:
            self.done += 1
            if self.done == len(self.plan):
                return "You arrive.", 1.0, True, False, {}
            return f"{self.done} steps walked.", 0.0, False, False, {}
        return "That is not the way.", 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{" + move + "}" for move in self.plan]
