# spade: domain=game skill=memory
import random
import re


class CardRecallEnv:
    max_turns = 8
    BOX = re.compile(r"\\boxed\{(.*?)\}")
    COLORS = ("red", "blue", "green", "gold", "pink", "gray", "white")

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.cards = rng.sample(self.COLORS, 5)
        self.asks = rng.sample(self.cards, 3)
        self.answered, self.turns = 0, 0
        shown = ", ".join(f"{i}: {c}" for i, c in enumerate(self.cards, 1))
        return (f"Memorise five cards by position: {shown}. They are now face down and will not "
                "be shown again. I name three colours, one per turn; answer with the card's "
                rf"position, e.g. \boxed{{2}}. A wrong answer loses. Where is {self.asks[0]}?"), {}

    def step(self, action):
        if self.answered == 3:
            return "The game is over.", 0.0, True, False, {}
        self.turns += 1
        cmd = (self.BOX.findall(str(action)) or [""])[-1].strip()
        color = self.asks[self.answered]
        text, reward, done = rf"Answer 1-5, e.g. \boxed{{2}}. Where is {color}?", 0.0, False
        if cmd in ("1", "2", "3", "4", "5"):
            if self.cards[int(cmd) - 1] != color:
                text, done = f"Wrong: card {cmd} is {self.cards[int(cmd) - 1]}. You lose.", True
            else:
                self.answered += 1
                if self.answered == 3:
                    text, reward, done = "All three found. You win!", 1.0, True
                else:
                    text = f"Correct. Where is {self.asks[self.answered]}?"
        return text, reward, done, self.turns >= self.max_turns, {}

    def solution(self):
        return [rf"\boxed{{{self.cards.index(c) + 1}}}" for c in self.asks]
