# spade: domain=game skill=planning
import random
import re


class TaskOrderEnv:
    max_turns = 10
    BOX = re.compile(r"\\boxed\{(.*?)\}")

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.order = rng.sample("abcde", 5)  # each task needs earlier ones
        self.needs = {t: sorted(rng.sample(self.order[:i], min(i, rng.randint(1, 2))))
                      for i, t in enumerate(self.order)}
        self.finished, self.energy, self.turns = [], 6, 0
        rules = "; ".join(f"{t} needs {', '.join(n) or 'nothing'}"
                          for t, n in sorted(self.needs.items()))
        return ("Finish tasks a-e. Each try costs 1 of your 6 energy. A task only "
                f"succeeds once the tasks it needs are done: {rules}. Try one task a turn, "
                r"e.g. \boxed{a}."), {}

    def step(self, action):
        self.turns += 1
        task = (self.BOX.findall(str(action)) or [""])[-1].strip().lower()
        text, reward, done = "Name a task: a, b, c, d or e.", 0.0, False
        if task in self.finished:
            text = f"Task {task} is already done."
        elif task in self.needs:
            self.energy -= 1
            missing = [t for t in self.needs[task] if t not in self.finished]
            if missing:
                text = f"Task {task} failed: do {', '.join(missing)} first."
            else:
                self.finished.append(task)
                text = f"Task {task} done."
            if len(self.finished) == 5:
                text, reward, done = "All tasks done. You win!", 1.0, True
            elif self.energy == 0:
                text, done = "Out of energy. You lose.", True
            else:
                text += f" Energy left: {self.energy}."
        return text, reward, done, self.turns >= self.max_turns, {}

    def solution(self):
        return [rf"\boxed{{{t}}}" for t in self.order]
