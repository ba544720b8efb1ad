# spade: domain=game skill=induction
import random
import re


class RuleFinderEnv:
    max_turns = 6
    BOX = re.compile(r"\\boxed\{(.*?)\}")

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.squared = rng.random() < 0.5  # the rule is x*x + b or a*x + b
        self.a, self.b = rng.randint(2, 6), rng.randint(-9, 9)
        xs = rng.sample(range(1, 13), 6)
        self.asks, self.answered, self.turns = xs[3:], 0, 0
        shown = ", ".join(f"f({x}) = {self.f(x)}" for x in xs[:3])
        return (f"A secret rule f(x) is a*x + b or x*x + b for whole a, b: {shown}. Find "
                "it, then answer three questions, one per turn, with a number such as "
                rf"\boxed{{12}}. A wrong answer loses. What is f({self.asks[0]})?"), {}

    def f(self, x):
        return (x * x if self.squared else self.a * x) + self.b

    def step(self, action):
        if self.answered == 3:
            return "The game is over.", 0.0, True, False, {}
        self.turns += 1
        cmd = (self.BOX.findall(str(action)) or [""])[-1].strip()
        x = self.asks[self.answered]
        text, reward, done = rf"Answer f({x}) with a number, e.g. \boxed{{12}}.", 0.0, False
        if re.fullmatch(r"-?\d{1,9}", cmd):
            if int(cmd) != self.f(x):
                text, done = f"Wrong: f({x}) = {self.f(x)}. You lose.", True
            else:
                self.answered += 1
                if self.answered == 3:
                    text, reward, done = "All three correct. You win!", 1.0, True
                else:
                    text = f"Correct. What is f({self.asks[self.answered]})?"
        return text, reward, done, self.turns >= self.max_turns, {}

    def solution(self):
        return [rf"\boxed{{{self.f(x)}}}" for x in self.asks]
