# spade: domain=game skill=spatial
"""Box pushing: walk a small warehouse and push the single crate onto the marked square.
You can push but never pull, so a crate shoved into a corner is lost for good."""

import collections
import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
MOVES = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}
ALIASES = {"n": "north", "up": "north", "s": "south", "down": "south", "w": "west",
           "left": "west", "e": "east", "right": "east"}


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


class BoxPushEnv:
    max_turns = 25
    height = 7
    width = 8

    def __init__(self, **kwargs):
        self.reset(seed=0)

    def _free(self, cell):
        return self.grid[cell[0]][cell[1]] != "#"

    def _plan(self, player, box):
        """Shortest direction list that puts the box on the target, or None."""
        start = (player, box)
        prev = {start: None}
        queue = collections.deque([start])
        while queue:
            state = queue.popleft()
            if state[1] == self.target:
                path = []
                while prev[state] is not None:
                    state, name = prev[state]
                    path.append(name)
                return path[::-1]
            (pr, pc), crate = state
            for name, (dr, dc) in MOVES.items():
                nxt = (pr + dr, pc + dc)
                if not self._free(nxt):
                    continue
                moved = crate
                if nxt == crate:
                    moved = (crate[0] + dr, crate[1] + dc)
                    if not self._free(moved):
                        continue
                new = (nxt, moved)
                if new not in prev:
                    prev[new] = (state, name)
                    queue.append(new)
        return None

    def _generate(self):
        h, w = self.height, self.width
        while True:
            self.grid = [["#"] * w for _ in range(h)]
            for r in range(1, h - 1):
                for c in range(1, w - 1):
                    self.grid[r][c] = "#" if self.rng.random() < 0.15 else "."
            floor = [(r, c) for r in range(1, h - 1) for c in range(1, w - 1)
                     if self.grid[r][c] == "."]
            if len(floor) < 12:
                continue
            player, box, target = self.rng.sample(floor, 3)
            if not all(2 <= r <= h - 3 and 2 <= c <= w - 3 for r, c in [box]):
                continue
            self.target = target
            plan = self._plan(player, box)
            if plan is None or not 6 <= len(plan) <= 18:
                continue
            pushes = self._push_directions(player, box, plan)
            if len(pushes) < 2 or len(set(pushes)) < 2:
                continue
            self.pos, self.box, self.plan = player, box, plan
            return

    def _push_directions(self, player, box, plan):
        pushes = []
        for name in plan:
            dr, dc = MOVES[name]
            nxt = (player[0] + dr, player[1] + dc)
            if nxt == box:
                box = (box[0] + dr, box[1] + dc)
                pushes.append(name)
            player = nxt
        return pushes

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self._generate()
        self.turns = 0
        self.pushes = 0
        self.finished = False
        self.truncated = False
        intro = (
            "Box pushing. You are @ in a warehouse; $ is a crate and x is the square it must end "
            "on. # is wall, . is floor.\n"
            "Moving into the crate pushes it one square in the same direction, if the square "
            "behind it is free. You cannot pull a crate, so avoid pushing it into corners or "
            "along walls it cannot leave.\n"
            "Commands: \\boxed{north}, \\boxed{south}, \\boxed{east}, \\boxed{west} (north is up). "
            f"At most {self.max_turns} turns.\n" + self._render()
        )
        return intro, self._info()

    def _render(self):
        lines = ["  " + "".join(str(c) for c in range(self.width))]
        for r, row in enumerate(self.grid):
            chars = []
            for c, ch in enumerate(row):
                cell = (r, c)
                if cell == self.pos:
                    ch = "@"
                elif cell == self.box:
                    ch = "$"
                elif cell == self.target:
                    ch = "x"
                chars.append(ch)
            lines.append(f"{r} " + "".join(chars))
        lines.append(f"You: row {self.pos[0]}, col {self.pos[1]}. Crate: row {self.box[0]}, "
                     f"col {self.box[1]}. Target: row {self.target[0]}, col {self.target[1]}.")
        return "\n".join(lines)

    def _info(self):
        return {"turn": self.turns, "pushes": self.pushes,
                "box": [self.box[0], self.box[1]]}

    def _result(self, text, reward=0.0, terminated=False):
        if terminated:
            self.finished = True
        truncated = (not terminated) and self.turns >= self.max_turns
        if truncated:
            self.truncated = True
            text += "\nOut of turns: the episode is over."
        return text, float(reward), bool(terminated), bool(truncated), self._info()

    def step(self, action):
        if self.finished or self.truncated:
            return ("The episode is over; call reset() to play again.", 0.0, self.finished,
                    self.truncated, self._info())
        self.turns += 1
        cmd = _command(action)
        if cmd is None:
            return self._result("No command found. Reply with a direction inside \\boxed{...}, "
                                "e.g. \\boxed{west}.\n" + self._render())
        cmd = cmd.replace("move ", "").replace("push ", "").replace("go ", "").strip()
        cmd = ALIASES.get(cmd, cmd)
        if cmd not in MOVES:
            return self._result(f"Unknown command '{cmd[:40]}'. Use north, south, east or west.\n"
                                + self._render())
        dr, dc = MOVES[cmd]
        nxt = (self.pos[0] + dr, self.pos[1] + dc)
        if not self._free(nxt):
            return self._result(f"A wall blocks you to the {cmd}.\n" + self._render())
        if nxt != self.box:
            self.pos = nxt
            return self._result(f"You walk {cmd}.\n" + self._render())
        behind = (self.box[0] + dr, self.box[1] + dc)
        if not self._free(behind):
            return self._result(f"The crate will not move {cmd}: a wall is behind it.\n"
                                + self._render())
        self.pos, self.box = nxt, behind
        self.pushes += 1
        if self.box == self.target:
            return self._result("The crate slides onto the target. You win!\n" + self._render(),
                                1.0, True)
        if self._plan(self.pos, self.box) is None:
            return self._result("The crate is stuck where it can never reach the target. "
                                "You lose.\n" + self._render(), 0.0, True)
        return self._result(f"You push the crate {cmd}.\n" + self._render())

    def solution(self):
        return [f"\\boxed{{{name}}}" for name in self.plan]
