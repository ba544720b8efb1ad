# spade: domain=game skill=planning
"""River crossing: ferry every passenger from the west bank to the east bank in a small boat.
Some pairs must never be left together on a bank without you; the boat needs you aboard."""

import collections
import itertools
import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
CAST = ["wolf", "goat", "cabbage", "fox", "hen", "grain", "cat", "mouse", "dog", "rabbit",
        "lettuce", "snake", "bird", "cheese"]
FILLER = {"cross", "take", "with", "and", "the", "a", "an", "alone", "nothing", "row", "boat",
          "sail", "go", "me", "bring", "carry", "over", "back", "myself", ",", "&", "+"}


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


class RiverCrossingEnv:
    max_turns = 20

    def __init__(self, **kwargs):
        self.reset(seed=0)

    def _safe(self, group):
        return not any(a in group and b in group for a, b in self.conflicts)

    def _moves(self, state):
        farmer, east = state
        here = [x for x in self.cast if (x in east) == (farmer == "east")]
        for size in range(0, self.capacity + 1):
            for cargo in itertools.combinations(here, size):
                if farmer == "west":
                    new_east = east | frozenset(cargo)
                    nxt = ("east", new_east)
                    left_behind = [x for x in self.cast if x not in new_east]
                else:
                    new_east = east - frozenset(cargo)
                    nxt = ("west", new_east)
                    left_behind = sorted(new_east)
                if self._safe(left_behind):
                    yield cargo, nxt

    def _solve(self):
        start = ("west", frozenset())
        goal = ("east", frozenset(self.cast))
        prev = {start: None}
        queue = collections.deque([start])
        while queue:
            state = queue.popleft()
            if state == goal:
                plan = []
                while prev[state] is not None:
                    state, cargo = prev[state]
                    plan.append(cargo)
                return plan[::-1]
            for cargo, nxt in self._moves(state):
                if nxt not in prev:
                    prev[nxt] = (state, cargo)
                    queue.append(nxt)
        return None

    def _generate(self):
        while True:
            size, self.capacity = self.rng.choice([(4, 1), (5, 2), (5, 2), (4, 2)])
            self.cast = sorted(self.rng.sample(CAST, size))
            pairs = list(itertools.combinations(self.cast, 2))
            self.conflicts = self.rng.sample(pairs, self.rng.randint(2, min(5, len(pairs))))
            plan = self._solve()
            if plan is not None and 7 <= len(plan) <= 13:
                self.plan = plan
                return

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self._generate()
        self.farmer = "west"
        self.east = set()
        self.turns = 0
        self.finished = False
        self.truncated = False
        rules = "\n".join(f"  - the {a} and the {b} must never be on a bank without you"
                          for a, b in self.conflicts)
        seats = "one passenger" if self.capacity == 1 else f"up to {self.capacity} passengers"
        intro = (
            f"River crossing. You, the ferryman, stand on the west bank with: "
            f"{', '.join(self.cast)}. Everyone must reach the east bank.\n"
            f"The boat carries you plus {seats}, and it only moves with you rowing.\n"
            f"Forbidden pairs:\n{rules}\n"
            "If a forbidden pair is left on a bank you are not on, the game is lost. Pairs "
            "travelling with you in the boat are safe.\n"
            "Commands: \\boxed{cross} (row alone), \\boxed{cross goat} or \\boxed{cross goat "
            f"cabbage}} (row with passengers from your bank). At most {self.max_turns} turns.\n"
            + self._status()
        )
        return intro, self._info()

    def _status(self):
        west = [x for x in self.cast if x not in self.east]
        east = [x for x in self.cast if x in self.east]
        return (f"West bank: {', '.join(west) or 'nobody'}. East bank: "
                f"{', '.join(east) or 'nobody'}. You and the boat are on the {self.farmer} bank.")

    def _info(self):
        return {"turn": self.turns, "boat": self.farmer, "east": sorted(self.east)}

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
            return self._result("No command found. Reply inside \\boxed{...}, e.g. \\boxed{cross} "
                                "or \\boxed{cross " + self.cast[0] + "}. " + self._status())
        words = [w for w in re.split(r"[\s,&+]+", cmd) if w and w not in FILLER]
        words = [w[:-1] if w.endswith("s") and w[:-1] in self.cast else w for w in words]
        if not cmd.split() or cmd.split()[0] not in ("cross", "take", "row", "bring", "carry",
                                                     "sail", "go"):
            return self._result(f"Unknown command '{cmd[:40]}'. Use cross, or cross with "
                                "passenger names. " + self._status())
        unknown = [w for w in words if w not in self.cast]
        if unknown:
            return self._result(f"Nobody called '{unknown[0][:20]}' is here. " + self._status())
        cargo = sorted(set(words))
        if len(cargo) > self.capacity:
            return self._result(f"The boat holds at most {self.capacity} passenger(s) besides "
                                "you. " + self._status())
        away = [x for x in cargo if (x in self.east) != (self.farmer == "east")]
        if away:
            return self._result(f"The {away[0]} is on the other bank. " + self._status())
        if self.farmer == "west":
            self.east |= set(cargo)
            self.farmer = "east"
        else:
            self.east -= set(cargo)
            self.farmer = "west"
        behind = sorted(self.east) if self.farmer == "west" else \
            [x for x in self.cast if x not in self.east]
        trip = f"You row to the {self.farmer} bank" + (f" with the {' and the '.join(cargo)}."
                                                       if cargo else " alone.")
        for a, b in self.conflicts:
            if a in behind and b in behind:
                return self._result(f"{trip} Left alone, the {a} and the {b} clash. You lose. "
                                    + self._status(), 0.0, True)
        if self.farmer == "east" and len(self.east) == len(self.cast):
            return self._result(f"{trip} Everyone is across. You win!", 1.0, True)
        return self._result(f"{trip} " + self._status())

    def solution(self):
        return ["\\boxed{cross" + "".join(" " + x for x in cargo) + "}" for cargo in self.plan]
