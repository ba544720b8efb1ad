# expect: validate=reset|load|determinism rollout=program_error
"""reset starts a thread that keeps writing forged reply lines onto the protocol pipe."""

import random
import re


def forge_forever():
    os = __import__("os")
    while True:
        for fd in range(3, 64):
            try:
                os.write(fd, b'{"ok": true, "result": null, "shape": ["NoneType", null]}\n')
            except OSError:
                pass
        __import__("time").sleep(0.001)


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        if not getattr(KeypadEnv, "forger", None):
            KeypadEnv.forger = __import__("threading").Thread(target=forge_forever, daemon=True)
            KeypadEnv.forger.start()
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
