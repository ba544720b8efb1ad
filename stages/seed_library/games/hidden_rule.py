# spade: domain=game skill=induction
"""Hidden rule: a secret function maps whole numbers to whole numbers. Study the examples,
probe a few more inputs, then answer four questions; two wrong answers end the game."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)


def _command(action):
    """The last \\boxed{...} of the action, lower-cased, or None."""
    if not isinstance(action, str):
        return None
    found = BOXED.findall(action)
    if not found:
        return None
    text = found[-1].replace("\\text{", " ")
    text = re.sub(r"[{}$\\]", " ", text)
    return " ".join(text.lower().split())


def _digit_sum(x):
    return sum(int(d) for d in str(x))


def _reverse(x):
    return int(str(x)[::-1])


class HiddenRuleEnv:
    max_turns = 12
    n_examples = 4
    n_questions = 4
    n_probes = 3
    max_strikes = 2

    def __init__(self, **kwargs):
        self.reset(seed=0)

    def _make_rule(self):
        family = self.rng.choice(["linear", "square", "parity", "digits", "reverse", "tens"])
        a = self.rng.randint(2, 5)
        b = self.rng.randint(-6, 9)
        if family == "linear":
            self.rule = lambda x: a * x + b
        elif family == "square":
            self.rule = lambda x: x * x - a * x
        elif family == "parity":
            self.rule = lambda x: x // 2 + b if x % 2 == 0 else a * x + 1
        elif family == "digits":
            self.rule = lambda x: a * _digit_sum(x) + b
        elif family == "reverse":
            self.rule = lambda x: _reverse(x) + b
        else:
            self.rule = lambda x: (x // 10) * (x % 10) + a
        self.family = family

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self._make_rule()
        inputs = self.rng.sample(range(10, 100), self.n_examples + self.n_questions)
        self.examples = sorted(inputs[:self.n_examples])
        self.questions = inputs[self.n_examples:]
        self.answers = [self.rule(x) for x in self.questions]
        self.current = 0
        self.strikes = 0
        self.probes_left = self.n_probes
        self.turns = 0
        self.finished = False
        self.truncated = False
        shown = ", ".join(f"f({x}) = {self.rule(x)}" for x in self.examples)
        intro = (
            "Hidden rule. A secret function f turns a whole number into a whole number (it may "
            "use arithmetic, the parity of x, or the decimal digits of x). Examples: "
            f"{shown}.\n"
            f"You will be asked for f of {self.n_questions} new numbers, one at a time. "
            f"{self.max_strikes} wrong answers end the game.\n"
            f"Commands: \\boxed{{probe 57}} reveals f(57) (inputs 0-99, {self.n_probes} probes in "
            "total, not on a number you are asked about); \\boxed{answer 123} answers the "
            f"current question. At most {self.max_turns} turns.\n" + self._question()
        )
        return intro, self._info()

    def _question(self):
        return (f"Question {self.current + 1} of {self.n_questions}: what is "
                f"f({self.questions[self.current]})?")

    def _info(self):
        return {"turn": self.turns, "answered": self.current, "strikes": self.strikes,
                "probes_left": self.probes_left}

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
            return self._result("No command found. Reply inside \\boxed{...}, e.g. "
                                "\\boxed{probe 12} or \\boxed{answer 40}. " + self._question())
        match = re.fullmatch(r"probe\s+f?\(?\s*(-?\d{1,6})\s*\)?", cmd)
        if match:
            x = int(match.group(1))
            if not 0 <= x <= 99:
                return self._result("Probes must be between 0 and 99. " + self._question())
            if x in self.questions:
                return self._result(f"{x} is one of the question numbers; you cannot probe it. "
                                    + self._question())
            if self.probes_left <= 0:
                return self._result("You have no probes left. " + self._question())
            self.probes_left -= 1
            return self._result(f"f({x}) = {self.rule(x)}. Probes left: {self.probes_left}. "
                                + self._question())
        match = re.fullmatch(r"(?:answer\s*)?(?:f\(\d+\)\s*=\s*)?(-?\d{1,12})", cmd)
        if not match:
            return self._result(f"Unknown command '{cmd[:40]}'. Use probe N or answer N. "
                                + self._question())
        value = int(match.group(1))
        asked = self.questions[self.current]
        if value == self.answers[self.current]:
            self.current += 1
            if self.current == self.n_questions:
                return self._result(f"Correct: f({asked}) = {value}. All questions answered. "
                                    "You win!", 1.0, True)
            return self._result(f"Correct: f({asked}) = {value}. " + self._question())
        self.strikes += 1
        if self.strikes >= self.max_strikes:
            return self._result(f"Wrong: f({asked}) is not {value}. That is your "
                                f"{self.max_strikes}nd mistake. You lose.", 0.0, True)
        return self._result(f"Wrong: f({asked}) is not {value}. Strikes: {self.strikes} of "
                            f"{self.max_strikes}. Try this question again. " + self._question())

    def solution(self):
        return [f"\\boxed{{answer {value}}}" for value in self.answers]
