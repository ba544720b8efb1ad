# spade: domain=game skill=spatial
"""Key-and-door maze: walk a walled grid, pick up the key, unlock the single door in the
dividing wall and reach the exit. Walls block movement; the map is redrawn every turn."""

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


class KeyDoorMazeEnv:
    max_turns = 25
    height = 7
    width = 9

    def __init__(self, **kwargs):
        self.reset(seed=0)

    # -- generation -------------------------------------------------------------------------
    def _bfs(self, start, goal, passable):
        """Shortest list of direction names from start to goal, or None."""
        prev = {start: None}
        queue = collections.deque([start])
        while queue:
            cell = queue.popleft()
            if cell == goal:
                path = []
                while prev[cell] is not None:
                    cell, name = prev[cell]
                    path.append(name)
                return path[::-1]
            for name, (dr, dc) in MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if nxt not in prev and passable(nxt):
                    prev[nxt] = (cell, name)
                    queue.append(nxt)
        return None

    def _generate(self):
        h, w = self.height, self.width
        while True:
            grid = [["#"] * w for _ in range(h)]
            for r in range(1, h - 1):
                for c in range(1, w - 1):
                    grid[r][c] = "#" if self.rng.random() < 0.22 else "."
            wall_col = self.rng.randint(3, w - 4)
            for r in range(1, h - 1):
                grid[r][wall_col] = "#"
            door = (self.rng.randint(1, h - 2), wall_col)
            left = [(r, c) for r in range(1, h - 1) for c in range(1, wall_col)
                    if grid[r][c] == "."]
            right = [(r, c) for r in range(1, h - 1) for c in range(wall_col + 1, w - 1)
                     if grid[r][c] == "."]
            if len(left) < 3 or len(right) < 2:
                continue
            start, key = self.rng.sample(left, 2)
            goal = self.rng.choice(right)
            grid[door[0]][door[1]] = "D"

            def open_floor(cell):
                return grid[cell[0]][cell[1]] == "."

            def with_door(cell):
                return grid[cell[0]][cell[1]] in ".D"

            to_key = self._bfs(start, key, open_floor)
            to_goal = self._bfs(key, goal, with_door)
            direct = self._bfs(start, goal, with_door)
            if to_key is None or to_goal is None or direct is None:
                continue
            total = len(to_key) + len(to_goal)
            if not 10 <= total <= 18 or len(to_key) < 3 or total < len(direct) + 2:
                continue
            self.grid, self.pos, self.key, self.goal, self.door = grid, start, key, goal, door
            self.plan = to_key + to_goal
            return

    # -- the game contract ------------------------------------------------------------------
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self._generate()
        self.start = self.pos
        self.has_key = False
        self.door_open = False
        self.turns = 0
        self.finished = False
        self.truncated = False
        intro = (
            "Key-and-door maze. You are @ on the map below (rows are numbered down the left side, columns across the top; north is up).\n"
            "Legend: # wall, . floor, k key, D locked door, E exit.\n"
            "The exit lies beyond a wall whose only gap is the locked door. Walk onto the key to "
            "pick it up; walking into the door while holding the key unlocks it and uses the key. "
            "Reach E to win.\n"
            "Commands: \\boxed{north}, \\boxed{south}, \\boxed{east}, \\boxed{west} (one step each; "
            f"n/s/e/w also work). At most {self.max_turns} turns.\n" + self._render()
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
                elif cell == self.goal:
                    ch = "E"
                elif cell == self.key and not self.has_key and not self.door_open:
                    ch = "k"
                elif cell == self.door:
                    ch = "." if self.door_open else "D"
                chars.append(ch)
            lines.append(f"{r} " + "".join(chars))
        status = "holding the key" if self.has_key else ("door unlocked" if self.door_open
                                                          else "no key yet")
        lines.append(f"You are at row {self.pos[0]}, column {self.pos[1]} ({status}).")
        return "\n".join(lines)

    def _info(self):
        return {"turn": self.turns, "row": self.pos[0], "col": self.pos[1], "has_key": self.has_key}

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
                                "e.g. \\boxed{north}.\n" + self._render())
        cmd = cmd.replace("move ", "").replace("go ", "").strip()
        cmd = ALIASES.get(cmd, cmd)
        if cmd not in MOVES:
            return self._result(f"Unknown command '{cmd[:40]}'. Use north, south, east or west.\n"
                                + self._render())
        dr, dc = MOVES[cmd]
        nxt = (self.pos[0] + dr, self.pos[1] + dc)
        tile = self.grid[nxt[0]][nxt[1]]
        if tile == "#":
            return self._result(f"You bump into a wall moving {cmd}.\n" + self._render())
        if tile == "D" and not self.door_open:
            if not self.has_key:
                return self._result("The door is locked and you have no key.\n" + self._render())
            self.has_key = False
            self.door_open = True
            self.pos = nxt
            return self._result("You unlock the door with the key and step through the doorway.\n"
                                + self._render())
        self.pos = nxt
        if nxt == self.goal:
            return self._result("You reach the exit. You win!\n" + self._render(), 1.0, True)
        note = f"You move {cmd}."
        if nxt == self.key and not self.has_key and not self.door_open:
            self.has_key = True
            note += " You pick up the key."
        return self._result(note + "\n" + self._render())

    def solution(self):
        return [f"\\boxed{{{name}}}" for name in self.plan]
