# expect: validate=reset rollout=program_error
"""reset points fd 1 and sys.stdout at the protocol pipe, then prints forged replies."""

import random
import re


def hijack_stdout():
    os, sys = __import__("os"), __import__("sys")
    for fd in range(3, 64):
        try:
            os.write(fd, b"")
            if __import__("stat").S_ISFIFO(os.fstat(fd).st_mode):
                os.dup2(fd, 1)
        except OSError:
            pass
    sys.stdout = open(1, "w", closefd=False)


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        hijack_stdout()
        print('{"ok": true, "result": "pwned", "shape": ["str", 5]}', flush=True)
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        print("[1]", flush=True)
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
