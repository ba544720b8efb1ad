# spade: domain=game skill=planning
"""Cyclic Tower of Hanoi: stack every disk on the goal peg, moving one top disk at a time,
never onto a smaller disk, and only clockwise around the ring of pegs (A to B, B to C, C to A).

An illegal move ends the episode unwon: with only three possible moves and 81 arrangements, a
forgiving board lets any memorised move list wander onto the goal (about one game in eight),
while a plan for another start breaks a rule within a few moves."""

import collections
import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
PEGS = "abc"
CLOCKWISE = {0: 1, 1: 2, 2: 0}


def _command(action):
    """The last \\boxed{...} of the action, lower-cased, or None."""
    if not isinstance(action, str):
        return None
    found = BOXED.findall(action)
    if not found:
        return None
    text = found[-1].replace("\\text{", " ").replace("\\to", " ").replace("\\rightarrow", " ")
    text = re.sub(r"[{}$\\]", " ", text)
    return " ".join(text.lower().split())


class CyclicHanoiEnv:
    max_turns = 22
    n_disks = 4

    def __init__(self, **kwargs):
        self.reset(seed=0)

    @staticmethod
    def _stacks(state):
        """state[d] is the peg of disk d (0 is the smallest); returns bottom-to-top stacks."""
        stacks = [[], [], []]
        for disk in range(len(state) - 1, -1, -1):
            stacks[state[disk]].append(disk)
        return stacks

    def _moves(self, state):
        stacks = self._stacks(state)
        for src in range(3):
            if not stacks[src]:
                continue
            dst = CLOCKWISE[src]
            disk = stacks[src][-1]
            if stacks[dst] and stacks[dst][-1] < disk:
                continue
            nxt = list(state)
            nxt[disk] = dst
            yield (src, dst), tuple(nxt)

    def _generate(self):
        while True:
            start = tuple(self.rng.randrange(3) for _ in range(self.n_disks))
            goal_peg = self.rng.randrange(3)
            goal = (goal_peg,) * self.n_disks
            prev = {start: None}
            queue = collections.deque([start])
            while queue:
                state = queue.popleft()
                if state == goal:
                    break
                for move, nxt in self._moves(state):
                    if nxt not in prev:
                        prev[nxt] = (state, move)
                        queue.append(nxt)
            plan = []
            state = goal
            while prev[state] is not None:
                state, move = prev[state]
                plan.append(move)
            if 7 <= len(plan) <= 16:
                self.state, self.goal_peg, self.plan = list(start), goal_peg, plan[::-1]
                return

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self._generate()
        self.turns = 0
        self.finished = False
        self.truncated = False
        intro = (
            f"Cyclic Tower of Hanoi. {self.n_disks} disks, sizes 1 (smallest) to "
            f"{self.n_disks}, sit on three pegs A, B and C. Goal: all disks stacked on peg "
            f"{PEGS[self.goal_peg].upper()}.\n"
            "Rules: move one top disk per turn; never put a disk on a smaller one; and disks may "
            "only travel clockwise: A to B, B to C, or C to A (never backwards). An illegal "
            "move ends the game.\n"
            "Command: \\boxed{move A B} moves the top disk of A onto B. "
            f"At most {self.max_turns} turns.\n" + self._status()
        )
        return intro, self._info()

    def _status(self):
        stacks = self._stacks(self.state)
        parts = []
        for peg in range(3):
            disks = " ".join(str(d + 1) for d in stacks[peg]) or "empty"
            parts.append(f"{PEGS[peg].upper()}: [{disks}]")
        return "Pegs (bottom to top): " + "  ".join(parts) + "."

    def _info(self):
        return {"turn": self.turns, "pegs": [PEGS[p] for p in self.state]}

    def _result(self, text, reward=0.0, terminated=False):
        if terminated:
            self.finished = True
        truncated = (not terminated) and self.turns >= self.max_turns
        if truncated:
            self.truncated = True
            text += " Out of turns: the episode is over."
        return text, float(reward), bool(terminated), bool(truncated), self._info()

    def _illegal(self, why):
        return self._result(f"Illegal move: {why} The game is over. " + self._status(),
                            terminated=True)

    def step(self, action):
        if self.finished or self.truncated:
            return ("The episode is over; call reset() to play again.", 0.0, self.finished,
                    self.truncated, self._info())
        self.turns += 1
        cmd = _command(action)
        if cmd is None:
            return self._result("No command found. Reply inside \\boxed{...}, e.g. "
                                "\\boxed{move A B}. " + self._status())
        words = [w for w in re.split(r"[\s,>\-]+", cmd)
                 if w not in ("move", "from", "to", "onto", "peg", "disk", "top", "")]
        if len(words) != 2 or any(w not in PEGS for w in words):
            return self._result(f"Unknown command '{cmd[:40]}'. Use move X Y with pegs A, B, C. "
                                + self._status())
        src, dst = PEGS.index(words[0]), PEGS.index(words[1])
        stacks = self._stacks(self.state)
        if dst != CLOCKWISE[src]:
            return self._illegal(f"disks only move clockwise, so from {PEGS[src].upper()} they "
                                 f"can only go to {PEGS[CLOCKWISE[src]].upper()}.")
        if not stacks[src]:
            return self._illegal(f"peg {PEGS[src].upper()} is empty.")
        disk = stacks[src][-1]
        if stacks[dst] and stacks[dst][-1] < disk:
            return self._illegal(f"disk {disk + 1} cannot go on the smaller disk "
                                 f"{stacks[dst][-1] + 1}.")
        self.state[disk] = dst
        note = f"Moved disk {disk + 1} from {PEGS[src].upper()} to {PEGS[dst].upper()}."
        if all(p == self.goal_peg for p in self.state):
            return self._result(note + " " + self._status() + " All disks are home. You win!",
                                1.0, True)
        return self._result(note + " " + self._status())

    def solution(self):
        return [f"\\boxed{{move {PEGS[a].upper()} {PEGS[b].upper()}}}" for a, b in self.plan]
