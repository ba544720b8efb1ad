# expect: validate=resources rollout=timeout
"""reset writes half a reply line (no newline) onto the protocol pipe, then spins forever."""

import random


def forge(line):
    os = __import__("os")
    for fd in range(3, 64):
        try:
            os.write(fd, line)
        except OSError:
            pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        forge(b'{"ok": true, "result": ["Press \\\\boxed{A}", ')
        while True:
            pass

    def step(self, action):
        return "nothing", 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in random.Random(0).sample("ABCDEFGH", 3)]
