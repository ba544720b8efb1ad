# spade: domain=game skill=arithmetic
import random
import re
from itertools import product


class NumberButtonsEnv:
    max_turns = 10
    BOX = re.compile(r"\\boxed\{(.*?)\}")

    def _run(self, value, buttons):
        for b in buttons:
            n = int(b[1:])
            value = value + n if b[0] == "+" else value - n if b[0] == "-" else value * n
        return value

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.buttons = [f"+{rng.randint(5, 9)}", f"-{rng.randint(1, 4)}", f"*{rng.randint(2, 3)}"]
        self.value = rng.randint(1, 9)
        # values reached too easily
        easy = {self._run(self.value, p) for k in range(6)
                for p in product(self.buttons, repeat=k) if k < 3 or len(set(p)) == 1}
        self.target = self.value
        while self.target in easy:
            self.plan = rng.choices(self.buttons, k=3)
            self.target = self._run(self.value, self.plan)
        self.left, self.turns = 5, 0
        return (f"Display: {self.value}. Reach {self.target} in at most 5 presses. "
                f"Buttons: {', '.join(self.buttons)}. Press one per turn, e.g. "
                rf"\boxed{{{self.buttons[0]}}}."), {}

    def step(self, action):
        self.turns += 1
        button = (self.BOX.findall(str(action)) or [""])[-1].strip()
        text, reward, done = f"Buttons: {', '.join(self.buttons)}.", 0.0, False
        if button in self.buttons:
            self.value = self._run(self.value, [button])
            self.left -= 1
            text = f"Display: {self.value} ({self.left} presses left)."
            if self.value == self.target:
                text, reward, done = "You win!", 1.0, True
            elif self.left == 0:
                text, done = "Out of presses. You lose.", True
        return text, reward, done, self.turns >= self.max_turns, {}

    def solution(self):
        return [rf"\boxed{{{b}}}" for b in self.plan]
