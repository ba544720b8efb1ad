# spade: domain=game skill=deduction
"""Seating logic: five guests sit in a row of seats; a list of clues allows exactly one
arrangement. Deduce it, reach it with seat swaps, then submit (two submissions at most)."""

import itertools
import random
import re

NAMES = ["Ada", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena"]
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


class SeatingLogicEnv:
    max_turns = 14
    n_seats = 5
    max_submissions = 2

    def __init__(self, **kwargs):
        self.reset(seed=0)

    # -- puzzle generation ------------------------------------------------------------------
    def _holds(self, clue, seat_of):
        kind = clue[0]
        if kind == "left_of":
            return seat_of[clue[1]] < seat_of[clue[2]]
        if kind == "right_after":
            return seat_of[clue[2]] == seat_of[clue[1]] + 1
        if kind == "next_to":
            return abs(seat_of[clue[1]] - seat_of[clue[2]]) == 1
        if kind == "not_next":
            return abs(seat_of[clue[1]] - seat_of[clue[2]]) > 1
        if kind == "gap":
            return abs(seat_of[clue[1]] - seat_of[clue[2]]) - 1 == clue[3]
        if kind == "not_seat":
            return seat_of[clue[1]] != clue[2]
        if kind == "end":
            return seat_of[clue[1]] in (0, self.n_seats - 1)
        if kind == "not_end":
            return seat_of[clue[1]] not in (0, self.n_seats - 1)
        return False

    def _text(self, clue):
        kind = clue[0]
        if kind == "left_of":
            return f"{clue[1]} sits somewhere to the left of {clue[2]}."
        if kind == "right_after":
            return f"{clue[2]} sits directly to the right of {clue[1]}."
        if kind == "next_to":
            return f"{clue[1]} and {clue[2]} sit next to each other."
        if kind == "not_next":
            return f"{clue[1]} and {clue[2]} do not sit next to each other."
        if kind == "gap":
            people = "person sits" if clue[3] == 1 else "people sit"
            return f"Exactly {clue[3]} {people} between {clue[1]} and {clue[2]}."
        if kind == "not_seat":
            return f"{clue[1]} is not in seat {clue[2] + 1}."
        if kind == "end":
            return f"{clue[1]} sits at one end of the row."
        return f"{clue[1]} does not sit at either end of the row."

    def _all_true_clues(self, seat_of):
        clues = []
        for a, b in itertools.permutations(self.guests, 2):
            clues.append(("left_of", a, b))
            clues.append(("right_after", a, b))
            if a < b:
                clues.append(("next_to", a, b))
                clues.append(("not_next", a, b))
                for k in range(1, self.n_seats - 1):
                    clues.append(("gap", a, b, k))
        for a in self.guests:
            for k in range(self.n_seats):
                clues.append(("not_seat", a, k))
            clues.append(("end", a))
            clues.append(("not_end", a))
        return [c for c in clues if self._holds(c, seat_of)]

    def _make_clues(self):
        seat_of = {name: i for i, name in enumerate(self.target)}
        pool = self._all_true_clues(seat_of)
        self.rng.shuffle(pool)
        candidates = [dict(zip(p, range(self.n_seats))) for p in itertools.permutations(self.guests)]
        chosen = []
        for clue in pool:
            kept = [c for c in candidates if self._holds(clue, c)]
            if len(kept) < len(candidates):
                chosen.append(clue)
                candidates = kept
            if len(candidates) == 1:
                break
        every = [dict(zip(p, range(self.n_seats))) for p in itertools.permutations(self.guests)]
        for clue in list(chosen):
            rest = [c for c in chosen if c is not clue]
            if sum(all(self._holds(c, s) for c in rest) for s in every) == 1:
                chosen = rest
        return chosen

    @staticmethod
    def _swap_distance(row, target):
        where = {name: i for i, name in enumerate(target)}
        seen, cycles = set(), 0
        for i in range(len(row)):
            if i in seen:
                continue
            cycles += 1
            j = i
            while j not in seen:
                seen.add(j)
                j = where[row[j]]
        return len(row) - cycles

    # -- the game contract ------------------------------------------------------------------
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.guests = sorted(self.rng.sample(NAMES, self.n_seats))
        self.target = list(self.guests)
        self.rng.shuffle(self.target)
        self.clues = self._make_clues()
        row = list(self.guests)
        self.rng.shuffle(row)
        while self._swap_distance(row, self.target) < 3:
            self.rng.shuffle(row)
        self.row = row
        self.start_row = list(row)
        self.turns = 0
        self.submissions_left = self.max_submissions
        self.finished = False
        self.truncated = False
        clue_lines = "\n".join(f"  {i + 1}. {self._text(c)}" for i, c in enumerate(self.clues))
        intro = (
            f"Seating puzzle. Five guests sit in a row of seats numbered 1 (far left) to "
            f"{self.n_seats} (far right). Exactly one arrangement satisfies all of these clues:\n"
            f"{clue_lines}\n"
            f"Current row: {self._row_text()}\n"
            "Commands (put exactly one in \\boxed{...}):\n"
            "  \\boxed{swap 2 4}  exchange the guests in seats 2 and 4\n"
            "  \\boxed{clues}     show the clues again\n"
            "  \\boxed{submit}    submit the current row as your answer\n"
            f"You may submit {self.max_submissions} times; a wrong submission tells you how many "
            f"guests are already in their correct seat. At most {self.max_turns} turns."
        )
        return intro, {"turn": 0, "submissions_left": self.submissions_left}

    def _row_text(self):
        return "  ".join(f"{i + 1}:{name}" for i, name in enumerate(self.row))

    def _result(self, text, reward=0.0, terminated=False):
        if terminated:
            self.finished = True
        truncated = (not terminated) and self.turns >= self.max_turns
        if truncated:
            self.truncated = True
            text += " Out of turns: the episode is over."
        info = {"turn": self.turns, "submissions_left": self.submissions_left}
        return text, float(reward), bool(terminated), bool(truncated), info

    def _seat(self, token):
        if token.isdecimal() and 1 <= int(token) <= self.n_seats:
            return int(token) - 1
        for i, name in enumerate(self.row):
            if token == name.lower():
                return i
        return None

    def step(self, action):
        if self.finished or self.truncated:
            return ("The episode is over; call reset() to play again.", 0.0, self.finished,
                    self.truncated, {"turn": self.turns, "submissions_left": self.submissions_left})
        self.turns += 1
        cmd = _command(action)
        if cmd is None:
            return self._result("No command found. Reply with one command inside \\boxed{...}, "
                                "e.g. \\boxed{swap 1 3} or \\boxed{submit}.")
        if cmd in ("clues", "show clues", "rules"):
            lines = " ".join(f"({i + 1}) {self._text(c)}" for i, c in enumerate(self.clues))
            return self._result(f"Clues: {lines} Current row: {self._row_text()}")
        if cmd in ("submit", "submit row", "done"):
            if self.row == self.target:
                return self._result(f"Correct! Every clue holds for {self._row_text()}. You win.",
                                    1.0, True)
            self.submissions_left -= 1
            right = sum(a == b for a, b in zip(self.row, self.target))
            if self.submissions_left <= 0:
                return self._result(f"Wrong: only {right} of {self.n_seats} guests are in the right "
                                    "seat, and no submissions are left. You lose.", 0.0, True)
            return self._result(f"Wrong: {right} of {self.n_seats} guests are in their correct seat. "
                                f"Submissions left: {self.submissions_left}. "
                                f"Current row: {self._row_text()}")
        match = re.fullmatch(r"swap\s+(\w+)\s*(?:,|and|with|&)?\s*(\w+)", cmd)
        if match:
            a, b = self._seat(match.group(1)), self._seat(match.group(2))
            if a is None or b is None:
                return self._result(f"Unknown seat in '{cmd[:60]}'. Use seat numbers 1-"
                                    f"{self.n_seats} or guest names. Row: {self._row_text()}")
            if a == b:
                return self._result(f"Those are the same seat; nothing changes. Row: {self._row_text()}")
            self.row[a], self.row[b] = self.row[b], self.row[a]
            return self._result(f"Swapped seats {a + 1} and {b + 1}. Row: {self._row_text()}")
        return self._result(f"Unknown command '{cmd[:60]}'. Use swap A B, clues, or submit. "
                            f"Row: {self._row_text()}")

    def solution(self):
        row, actions = list(self.start_row), []
        for i in range(self.n_seats):
            if row[i] != self.target[i]:
                j = row.index(self.target[i])
                row[i], row[j] = row[j], row[i]
                actions.append(f"\\boxed{{swap {i + 1} {j + 1}}}")
        actions.append("\\boxed{submit}")
        return actions
