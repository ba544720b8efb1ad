# spade: domain=game skill=arithmetic
"""Number forge: turn the start number into the target using a few arithmetic operations,
each with a limited number of uses. Division must be exact; values stay within 0..999."""

import collections
import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
SYMBOLS = {"x": "*", "×": "*", "÷": "/", "−": "-", "–": "-", ":": "/"}
LIMIT = 999


def _command(action):
    """The last \\boxed{...} of the action, lower-cased, or None."""
    if not isinstance(action, str):
        return None
    found = BOXED.findall(action)
    if not found:
        return None
    text = found[-1].replace("\\text{", " ").replace("\\times", "*").replace("\\div", "/")
    text = re.sub(r"[{}$\\]", " ", text)
    return " ".join(text.lower().split())


def _apply(value, op):
    """The result of one operation, or None if it is not allowed."""
    sign, amount = op
    if sign == "+":
        out = value + amount
    elif sign == "-":
        out = value - amount
    elif sign == "*":
        out = value * amount
    else:
        if value % amount:
            return None
        out = value // amount
    return out if 0 <= out <= LIMIT else None


class NumberForgeEnv:
    max_turns = 14

    def __init__(self, **kwargs):
        self.reset(seed=0)

    def _generate(self):
        while True:
            self.start = self.rng.randint(2, 9)
            ops = [("+", self.rng.randint(3, 9)), ("-", self.rng.randint(2, 7)),
                   ("*", self.rng.randint(2, 4)), ("/", self.rng.randint(2, 3))]
            if self.rng.random() < 0.5:
                ops.append(("+", self.rng.choice([11, 13, 15, 17])))
            self.rng.shuffle(ops)
            self.ops = ops
            self.limits = [self.rng.randint(1, 3) for _ in ops]
            start_state = (self.start, tuple(self.limits))
            prev = {start_state: None}
            depth = {self.start: 0}
            queue = collections.deque([(start_state, 0)])
            while queue:
                (value, uses), d = queue.popleft()
                if d == 6:
                    continue
                for i, op in enumerate(ops):
                    if uses[i] == 0:
                        continue
                    out = _apply(value, op)
                    if out is None:
                        continue
                    left = uses[:i] + (uses[i] - 1,) + uses[i + 1:]
                    state = (out, left)
                    if state not in prev:
                        prev[state] = ((value, uses), i)
                        depth.setdefault(out, d + 1)
                        queue.append((state, d + 1))
            choices = sorted(v for v, d in depth.items() if 5 <= d <= 6 and v >= 10)
            if not choices:
                continue
            self.target = self.rng.choice(choices)
            goal = min((s for s in prev if s[0] == self.target),
                       key=lambda s: sum(self.limits) - sum(s[1]))
            plan = []
            while prev[goal] is not None:
                goal, i = prev[goal]
                plan.append(i)
            self.plan = plan[::-1]
            return

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self._generate()
        self.value = self.start
        self.uses = list(self.limits)
        self.history = []
        self.turns = 0
        self.finished = False
        self.truncated = False
        intro = (
            f"Number forge. Start value: {self.start}. Target: {self.target}.\n"
            "Each operation below may be used only as many times as listed. Division is allowed "
            f"only when it is exact, and every intermediate value must stay within 0..{LIMIT}.\n"
            "Commands: \\boxed{+7} (apply an operation, written exactly as listed, e.g. *3 or /2), "
            "\\boxed{undo} (take back the last operation and get its use back).\n"
            f"Reach the target exactly within {self.max_turns} turns.\n" + self._status()
        )
        return intro, self._info()

    def _op_text(self, i):
        sign, amount = self.ops[i]
        return f"{sign}{amount}"

    def _status(self):
        ops = ", ".join(f"{self._op_text(i)} (uses left: {self.uses[i]})"
                        for i in range(len(self.ops)))
        return f"Current value: {self.value}. Target: {self.target}. Operations: {ops}."

    def _info(self):
        return {"turn": self.turns, "value": self.value, "target": self.target}

    def _result(self, text, reward=0.0, terminated=False):
        if terminated:
            self.finished = True
        truncated = (not terminated) and self.turns >= self.max_turns
        if truncated:
            self.truncated = True
            text += " Out of turns: the episode is over."
        return text, float(reward), bool(terminated), bool(truncated), self._info()

    def step(self, action):
        if self.finished or self.truncated:
            return ("The episode is over; call reset() to play again.", 0.0, self.finished,
                    self.truncated, self._info())
        self.turns += 1
        cmd = _command(action)
        if cmd is None:
            return self._result("No command found. Reply with one operation inside \\boxed{...}, "
                                "e.g. \\boxed{*2}. " + self._status())
        if cmd == "undo":
            if not self.history:
                return self._result("Nothing to undo. " + self._status())
            self.value, i = self.history.pop()
            self.uses[i] += 1
            return self._result(f"Undid {self._op_text(i)}. " + self._status())
        text = cmd.replace("apply", "").replace(" ", "")
        for old, new in SYMBOLS.items():
            text = text.replace(old, new)
        match = re.fullmatch(r"([+\-*/])(\d{1,4})", text)
        if not match:
            return self._result(f"Unknown command '{cmd[:40]}'. Write an operation such as "
                                f"{self._op_text(0)}, or undo. " + self._status())
        op = (match.group(1), int(match.group(2)))
        if op not in self.ops:
            return self._result(f"{op[0]}{op[1]} is not one of your operations. " + self._status())
        i = self.ops.index(op)
        if self.uses[i] == 0:
            return self._result(f"{self._op_text(i)} has no uses left. " + self._status())
        out = _apply(self.value, op)
        if out is None:
            why = "is not exact" if op[0] == "/" else f"leaves 0..{LIMIT}"
            return self._result(f"{self.value} {op[0]} {op[1]} {why}; not allowed. "
                                + self._status())
        self.history.append((self.value, i))
        self.uses[i] -= 1
        before, self.value = self.value, out
        if self.value == self.target:
            return self._result(f"{before} {op[0]} {op[1]} = {out}. Target reached. You win!",
                                1.0, True)
        return self._result(f"{before} {op[0]} {op[1]} = {out}. " + self._status())

    def solution(self):
        return [f"\\boxed{{{self._op_text(i)}}}" for i in self.plan]
