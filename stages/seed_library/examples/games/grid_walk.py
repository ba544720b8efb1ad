# spade: domain=game skill=spatial
import random
import re


class GridWalkEnv:
    max_turns = 20
    BOX = re.compile(r"\\boxed\{(.*?)\}")
    MOVES = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
    CELLS = [(r, c) for r in range(5) for c in range(5)]

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.route = []
        while len(set(self.route)) < 3:  # the route uses 3 directions
            self.pos, self.goal, *walls = rng.sample(self.CELLS, 9)
            self.free = set(self.CELLS) - set(walls)
            self.route = self._find_route()
        self.turns = 0
        return (f"Walk from {self.pos} to {self.goal} on a 5x5 grid of (row, column) cells. "
                rf"Walls: {sorted(walls)}. Step \boxed{{north}} (row - 1), south, east "
                "(column + 1) or west."), {}

    def _find_route(self):
        paths, todo = {self.pos: []}, [self.pos]
        for r, c in todo:  # breadth-first search
            for move, (dr, dc) in self.MOVES.items():
                cell = (r + dr, c + dc)
                if cell in self.free and cell not in paths:
                    paths[cell] = paths[(r, c)] + [move]
                    todo.append(cell)
        return paths.get(self.goal, [])

    def step(self, action):
        self.turns += 1
        cmd = (self.BOX.findall(str(action)) or [""])[-1].strip().lower()
        text, reward = "Use north, south, east or west.", 0.0
        if cmd in self.MOVES:
            dr, dc = self.MOVES[cmd]
            cell = (self.pos[0] + dr, self.pos[1] + dc)
            if cell in self.free:
                self.pos = cell
            text = f"You are at {cell}." if cell == self.pos else "Blocked."
            if cell == self.goal:
                text, reward = "Goal reached. You win!", 1.0
        return text, reward, reward == 1.0, self.turns >= self.max_turns, {}

    def solution(self):
        return [rf"\boxed{{{m}}}" for m in self.route]
