# spade: domain=game skill=memory
"""Memory vault: a ledger of lockers (label, contents, code) is shown once and then hidden.
Answer code requests from memory, by label or by contents, while tracking code changes that are
announced once; two mistakes lose."""

import random
import re

BOXED = re.compile(r"\\boxed\{(.*?)\}", re.S)
COLOURS = ["red", "blue", "green", "amber", "violet", "silver", "black", "white", "teal"]
ANIMALS = ["fox", "owl", "bear", "heron", "lynx", "otter", "crow", "moth", "seal", "wasp"]
ITEMS = ["umbrella", "compass", "violin", "teapot", "lantern", "chessboard", "telescope",
         "hourglass", "typewriter", "kite", "camera", "globe"]


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


class MemoryVaultEnv:
    max_turns = 12
    n_lockers = 6
    n_requests = 6
    max_strikes = 2

    def __init__(self, **kwargs):
        self.reset(seed=0)

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        colours = self.rng.sample(COLOURS, self.n_lockers)
        animals = self.rng.sample(ANIMALS, self.n_lockers)
        items = self.rng.sample(ITEMS, self.n_lockers)
        codes = self.rng.sample(range(100, 1000), self.n_lockers)
        self.lockers = [{"label": f"{c} {a}", "item": i, "code": k}
                        for c, a, i, k in zip(colours, animals, items, codes)]
        order = list(range(self.n_lockers))
        self.rng.shuffle(order)
        phase = self.rng.randint(0, 1)
        self.requests = [(index, "item" if (n + phase) % 2 else "label")
                         for n, index in enumerate(order[:self.n_requests])]
        # after opening request 2 and request 4, one later locker gets a new code (told once)
        self.changes = {}
        used = set(codes)
        for after in (2, 4):
            index = self.requests[self.rng.randint(after, self.n_requests - 1)][0]
            new_code = self.rng.choice([c for c in range(100, 1000) if c not in used])
            used.add(new_code)
            self.changes[after] = (index, new_code)
        self.codes = [x["code"] for x in self.lockers]
        self.current = 0
        self.strikes = 0
        self.started = False
        self.turns = 0
        self.finished = False
        self.truncated = False
        ledger = "\n".join(f"  locker '{x['label']}' holds the {x['item']}; code {x['code']}"
                           for x in self.lockers)
        intro = (
            "Memory vault. Memorise this ledger. It is shown only now and will never be shown "
            f"again:\n{ledger}\n"
            f"When you are ready, send \\boxed{{ready}}. You will then get {self.n_requests} "
            "requests, one at a time, each naming a locker by its label or by what it holds. "
            "Reply with that locker's code, e.g. \\boxed{417}. Watch out: the vault sometimes "
            "announces that a locker's code has changed, and says so only once. "
            f"{self.max_strikes} wrong codes and the vault locks for good. "
            f"At most {self.max_turns} turns."
        )
        return intro, self._info()

    def _request(self):
        index, kind = self.requests[self.current]
        locker = self.lockers[index]
        if kind == "label":
            what = f"the locker labelled '{locker['label']}'"
        else:
            what = f"the locker that holds the {locker['item']}"
        return f"Request {self.current + 1} of {self.n_requests}: enter the code of {what}."

    def _info(self):
        return {"turn": self.turns, "opened": self.current, "strikes": self.strikes}

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
        if not self.started:
            if cmd in ("ready", "start", "go", "ok", "hide"):
                self.started = True
                return self._result("The ledger is hidden. " + self._request())
            return self._result("Send \\boxed{ready} when you have memorised the ledger.")
        if cmd is None:
            return self._result("No command found. Reply with a code inside \\boxed{...}, e.g. "
                                "\\boxed{417}. " + self._request())
        if cmd in ("ledger", "show", "show ledger", "peek"):
            return self._result("The ledger is gone; you must rely on memory. " + self._request())
        match = re.fullmatch(r"(?:code\s*|enter\s*)?(\d{1,6})", cmd)
        if not match:
            return self._result(f"'{cmd[:30]}' is not a code. Reply with digits only, e.g. "
                                "\\boxed{417}. " + self._request())
        index, _ = self.requests[self.current]
        if int(match.group(1)) == self.codes[index]:
            self.current += 1
            if self.current == self.n_requests:
                return self._result("Click. Every requested locker is open. You win!", 1.0, True)
            note = ""
            if self.current in self.changes:
                changed, new_code = self.changes[self.current]
                self.codes[changed] = new_code
                note = (f"Notice: the code of locker '{self.lockers[changed]['label']}' has "
                        f"changed to {new_code}. ")
            return self._result("Click, the locker opens. " + note + self._request())
        self.strikes += 1
        if self.strikes >= self.max_strikes:
            return self._result("Wrong code. The vault locks for good. You lose.", 0.0, True)
        return self._result(f"Wrong code. Strikes: {self.strikes} of {self.max_strikes}. "
                            + self._request())

    def solution(self):
        codes = [x["code"] for x in self.lockers]
        actions = ["\\boxed{ready}"]
        for n, (index, _) in enumerate(self.requests):
            if n in self.changes:
                changed, new_code = self.changes[n]
                codes[changed] = new_code
            actions.append(f"\\boxed{{{codes[index]}}}")
        return actions
