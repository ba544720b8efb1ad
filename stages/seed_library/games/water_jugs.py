# spade: domain=game skill=arithmetic
"""Water jugs: three unmarked jugs, a metered tap (few fills) and a drain. Fill, empty and pour
until two named jugs hold exact amounts; a pour stops when the source is empty or the target full."""

import collections
import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
NAMES = ["a", "b", "c"]


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


class WaterJugsEnv:
    max_turns = 18

    def __init__(self, **kwargs):
        self.reset(seed=0)

    def _moves(self, state):
        """All (command, next_state) pairs from a state."""
        out = []
        for i in range(3):
            if state[i] < self.caps[i]:
                nxt = list(state)
                nxt[i] = self.caps[i]
                out.append((f"fill {NAMES[i]}", tuple(nxt)))
            if state[i] > 0:
                nxt = list(state)
                nxt[i] = 0
                out.append((f"empty {NAMES[i]}", tuple(nxt)))
            for j in range(3):
                if i != j and state[i] > 0 and state[j] < self.caps[j]:
                    amount = min(state[i], self.caps[j] - state[j])
                    nxt = list(state)
                    nxt[i] -= amount
                    nxt[j] += amount
                    out.append((f"pour {NAMES[i]} {NAMES[j]}", tuple(nxt)))
        return out

    def _generate(self):
        while True:
            big = self.rng.randint(9, 15)
            mid = self.rng.randint(4, big - 2)
            small = self.rng.randint(2, mid - 1)
            caps = [small, mid, big]
            self.rng.shuffle(caps)
            self.caps = caps
            start = (0, 0, 0)
            prev = {start: None}
            depth = {start: 0}
            queue = collections.deque([start])
            while queue:
                state = queue.popleft()
                for cmd, nxt in self._moves(state):
                    if nxt not in prev:
                        prev[nxt] = (state, cmd)
                        depth[nxt] = depth[state] + 1
                        queue.append(nxt)
            best = {}
            for state, d in depth.items():
                for i in range(3):
                    for j in range(i + 1, 3):
                        key = (i, state[i], j, state[j])
                        if key not in best or d < best[key][0]:
                            best[key] = (d, state)
            goals = sorted(k for k, (d, _) in best.items()
                           if 6 <= d <= 12 and 0 < k[1] < self.caps[k[0]]
                           and 0 < k[3] < self.caps[k[2]])
            if not goals:
                continue
            self.goal = self.rng.choice(goals)
            state = best[self.goal][1]
            plan = []
            while prev[state] is not None:
                state, cmd = prev[state]
                plan.append(cmd)
            self.plan = plan[::-1]
            self.tap_limit = sum(cmd.startswith("fill") for cmd in self.plan) + 1
            return

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self._generate()
        self.levels = [0, 0, 0]
        self.taps_left = self.tap_limit
        self.turns = 0
        self.finished = False
        self.truncated = False
        caps = ", ".join(f"{NAMES[i].upper()} holds {self.caps[i]} L" for i in range(3))
        intro = (
            f"Water jugs. You have three empty, unmarked jugs: {caps}. There is a tap and a drain.\n"
            f"Goal: at the same moment, jug {NAMES[self.goal[0]].upper()} must hold exactly "
            f"{self.goal[1]} L and jug {NAMES[self.goal[2]].upper()} exactly {self.goal[3]} L.\n"
            f"The tap is metered: you may fill a jug from it only {self.tap_limit} times in total.\n"
            "Commands: \\boxed{fill A} (fill A to the brim from the tap; uses one tap fill), \\boxed{empty A} (pour A "
            "down the drain), \\boxed{pour A B} (pour A into B until A is empty or B is full).\n"
            f"At most {self.max_turns} turns.\n" + self._status()
        )
        return intro, self._info()

    def _status(self):
        parts = ", ".join(f"{NAMES[i].upper()}={self.levels[i]}/{self.caps[i]}" for i in range(3))
        return (f"Jugs: {parts}. Tap fills left: {self.taps_left}. "
                f"Goal: {self._goal_text()}.")

    def _goal_text(self):
        i, x, j, y = self.goal
        return f"{NAMES[i].upper()}={x} and {NAMES[j].upper()}={y}"

    def _info(self):
        return {"turn": self.turns, "levels": list(self.levels), "taps_left": self.taps_left}

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
            return self._result("No command found. Reply with one command inside \\boxed{...}, "
                                "e.g. \\boxed{fill A}. " + self._status())
        words = [w for w in re.split(r"[\s,]+", cmd) if w not in ("jug", "into", "to", "from", "")]
        verb, jugs = (words[0], words[1:]) if words else ("", [])
        if any(j not in NAMES for j in jugs):
            return self._result(f"Unknown jug in '{cmd[:40]}'. The jugs are A, B and C. "
                                + self._status())
        idx = [NAMES.index(j) for j in jugs]
        if verb == "fill" and len(idx) == 1:
            i = idx[0]
            if self.taps_left <= 0:
                return self._result("The tap meter is used up; you cannot fill from the tap "
                                    "any more. " + self._status())
            self.taps_left -= 1
            self.levels[i] = self.caps[i]
            note = f"You fill {jugs[0].upper()} from the tap."
        elif verb in ("empty", "drain") and len(idx) == 1:
            i = idx[0]
            self.levels[i] = 0
            note = f"You empty {jugs[0].upper()} down the drain."
        elif verb == "pour" and len(idx) == 2 and idx[0] != idx[1]:
            i, j = idx
            amount = min(self.levels[i], self.caps[j] - self.levels[j])
            self.levels[i] -= amount
            self.levels[j] += amount
            note = f"You pour {amount} L from {jugs[0].upper()} into {jugs[1].upper()}."
        else:
            return self._result(f"Unknown command '{cmd[:40]}'. Use fill X, empty X or pour X Y. "
                                + self._status())
        i, x, j, y = self.goal
        if self.levels[i] == x and self.levels[j] == y:
            return self._result(note + " " + self._status() + " Exactly right. You win!", 1.0, True)
        return self._result(note + " " + self._status())

    def solution(self):
        actions = []
        for cmd in self.plan:
            verb, *jugs = cmd.split()
            actions.append("\\boxed{" + " ".join([verb] + [j.upper() for j in jugs]) + "}")
        return actions
