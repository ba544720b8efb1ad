# spade: domain=game skill=deduction
import random
import re
from itertools import permutations


class PetCluesEnv:
    max_turns = 6
    BOX = re.compile(r"\\boxed\{(.*?)\}")
    NAMES = ("ann", "ben", "eva")
    PETS = ("cat", "dog", "fish")

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.pets = rng.sample(self.PETS, 3)
        facts = [(i, p) for i in range(3) for p in self.PETS]
        rng.shuffle(facts)
        cases, clues = list(permutations(self.PETS)), []
        for i, p in facts:  # keep clues that rule out cases
            yes = self.pets[i] == p
            left = [c for c in cases if (c[i] == p) == yes]
            if len(left) < len(cases):
                cases = left
                clues.append(f"{self.NAMES[i]} {'owns' if yes else 'does not own'} the {p}.")
        self.matched, self.turns = set(), 0
        return ("ann, ben and eva own one each of a cat, a dog and a fish. " + " ".join(clues)
                + r" Name an owner and pet per turn, e.g. \boxed{ben cat}. Match all three to "
                "win; a wrong pair loses."), {}

    def step(self, action):
        self.turns += 1
        words = (self.BOX.findall(str(action)) or [""])[-1].lower().split()
        text, reward, done = r"Give a name and a pet, e.g. \boxed{ben cat}.", 0.0, False
        if len(words) == 2 and words[0] in self.NAMES and words[1] in self.PETS:
            if self.pets[self.NAMES.index(words[0])] != words[1]:
                text, done = "Wrong pair. You lose.", True
            else:
                self.matched.add(words[0])
                text = f"Right. {3 - len(self.matched)} to go."
                if len(self.matched) == 3:
                    text, reward, done = "All pets matched. You win!", 1.0, True
        return text, reward, done, self.turns >= self.max_turns, {}

    def solution(self):
        return [rf"\boxed{{{n} {p}}}" for n, p in zip(self.NAMES, self.pets)]
