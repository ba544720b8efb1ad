# spade: domain=game skill=deduction
"""Guess the number: find a hidden number from 1 to 1000; every wrong guess says higher or lower."""

import random
import re

GUESS = re.compile(r"\\boxed\{\s*([0-9]{1,6})\s*\}")


class GuessNumberEnv:
    max_turns = 12

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(1, 1000)
        self.turns = 0
        return ("I am thinking of a number from 1 to 1000. Guess it, e.g. \\boxed{500}. "
                f"You have {self.max_turns} guesses."), {}

    def step(self, action):
        self.turns += 1
        out_of_turns = self.turns >= self.max_turns
        guesses = GUESS.findall(action)
        if not guesses:
            return "Reply with a whole number inside \\boxed{}.", 0.0, False, out_of_turns, {}
        guess = int(guesses[-1])
        if guess == self.target:
            return f"{guess} is right. You win!", 1.0, True, False, {}
        direction = "higher" if guess < self.target else "lower"
        return f"{guess} is wrong: go {direction}.", 0.0, False, out_of_turns, {}

    def solution(self):
        """Binary search: at most 10 guesses, each halving the range left."""
        low, high, actions = 1, 1000, []
        while True:
            middle = (low + high) // 2
            actions.append(f"\\boxed{{{middle}}}")
            if middle == self.target:
                return actions
            if middle < self.target:
                low = middle + 1
            else:
                high = middle - 1
