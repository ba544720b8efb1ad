# spade: domain=game skill=planning
"""Workshop crafting: turn a fixed stock of raw materials into one target item through
intermediate parts. Stock is exactly enough, recipes share materials, and some recipes are traps."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
RAWS = ["wood", "stone", "iron", "coal", "sand", "clay", "fiber", "resin", "copper", "wax"]
PARTS = ["plank", "brick", "gear", "rope", "glass", "nail", "cloth", "glue", "wire", "hinge"]
TARGETS = ["lantern", "cart", "loom", "clock", "raft", "kiln", "windmill", "telescope"]
TRAPS = ["torch", "bowl", "statue", "whistle", "candle", "basket"]


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


class CraftingEnv:
    max_turns = 10

    def __init__(self, **kwargs):
        self.reset(seed=0)

    def _generate(self):
        while True:
            raws = self.rng.sample(RAWS, 4)
            parts = self.rng.sample(PARTS, 3)
            self.target = self.rng.choice(TARGETS)
            traps = self.rng.sample(TRAPS, 2)
            recipes = {}
            for i, part in enumerate(parts):
                recipes[part] = {r: self.rng.randint(1, 2) for r in self.rng.sample(raws, 2)}
                if i > 0 and self.rng.random() < 0.6:
                    recipes[part][parts[self.rng.randrange(i)]] = 1
            recipes[self.target] = {part: self.rng.randint(1, 2) for part in parts[1:]}
            if parts[0] not in recipes[parts[1]] and parts[0] not in recipes[parts[2]]:
                recipes[self.target][parts[0]] = 1
            recipes[self.target][self.rng.choice(raws)] = 1
            self.parts, self.recipes = parts, recipes
            self.raws, self.traps = raws, traps
            demand = self._demand({})
            counts = [demand[p] for p in parts]
            if not 4 <= sum(counts) <= 6:
                continue
            users = {r: [item for item in parts + [self.target] if r in recipes[item]]
                     for r in raws}
            if any(len(users[r]) < 1 for r in raws):
                continue
            if not all(any(len(users[r]) >= 2 for r in recipes[p] if r in raws) for p in parts):
                continue
            for trap in traps:
                recipes[trap] = {r: self.rng.randint(1, 2) for r in self.rng.sample(raws, 2)}
            self.stock0 = {r: demand[r] for r in raws}
            self.counts = dict(zip(parts, counts))
            return

    def _demand(self, inventory):
        """Items still to craft and raw materials still needed to finish the target."""
        demand = {item: 0 for item in self.raws + self.parts}
        demand[self.target] = 0 if inventory.get(self.target, 0) else 1
        for item in [self.target] + self.parts[::-1]:
            if item != self.target:
                held = inventory.get(item, 0)
                demand[item] = max(0, demand[item] - held)
            for ingredient, q in self.recipes[item].items():
                demand[ingredient] += q * demand[item]
        return demand

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self._generate()
        self.inventory = dict(self.stock0)
        for item in self.parts + self.traps + [self.target]:
            self.inventory[item] = 0
        self.turns = 0
        self.finished = False
        self.truncated = False
        order = self.parts + self.traps
        self.rng.shuffle(order)
        self.book = order + [self.target]
        lines = "\n".join(f"  {item}: {self._recipe_text(item)}" for item in self.book)
        intro = (
            f"Workshop. Craft one {self.target}. Each craft consumes the listed inputs and makes "
            "exactly one item. Nothing can be taken apart again and no new raw material arrives.\n"
            f"Recipes:\n{lines}\n"
            "Commands: \\boxed{craft glass} (craft one item), \\boxed{recipes} (show the recipes "
            f"again). At most {self.max_turns} turns.\n" + self._status()
        )
        return intro, self._info()

    def _recipe_text(self, item):
        return " + ".join(f"{q} {r}" for r, q in self.recipes[item].items())

    def _status(self):
        held = ", ".join(f"{k} {v}" for k, v in self.inventory.items() if v)
        return f"Inventory: {held or 'empty'}."

    def _info(self):
        return {"turn": self.turns, "inventory": {k: v for k, v in self.inventory.items() if v}}

    def _still_possible(self):
        demand = self._demand(self.inventory)
        return all(self.inventory[r] >= demand[r] for r in self.raws)

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
                                f"\\boxed{{craft {self.parts[0]}}}. " + self._status())
        if cmd in ("recipes", "recipe", "help"):
            lines = "; ".join(f"{item}: {self._recipe_text(item)}" for item in self.book)
            return self._result(f"Recipes: {lines}. " + self._status())
        match = re.fullmatch(r"(?:craft|make|build)\s+(?:a |an |one |1 )?([a-z]+)", cmd)
        if not match:
            return self._result(f"Unknown command '{cmd[:40]}'. Use craft ITEM or recipes. "
                                + self._status())
        item = match.group(1)
        if item.endswith("s") and item[:-1] in self.recipes:
            item = item[:-1]
        if item not in self.recipes:
            return self._result(f"There is no recipe for '{item[:30]}'. " + self._status())
        lacking = [f"{q - self.inventory[r]} more {r}" for r, q in self.recipes[item].items()
                   if self.inventory[r] < q]
        if lacking:
            return self._result(f"Cannot craft {item}: you need {', '.join(lacking)}. "
                                + self._status())
        for r, q in self.recipes[item].items():
            self.inventory[r] -= q
        self.inventory[item] += 1
        if item == self.target:
            return self._result(f"You craft the {item}. Goal complete. You win!", 1.0, True)
        if not self._still_possible():
            return self._result(f"You craft a {item}, but the remaining materials can no longer "
                                f"make a {self.target}. You lose. " + self._status(), 0.0, True)
        return self._result(f"You craft a {item}. " + self._status())

    def solution(self):
        actions = []
        for part in self.parts:
            actions += [f"\\boxed{{craft {part}}}"] * self.counts[part]
        return actions + [f"\\boxed{{craft {self.target}}}"]
