# expect: validate=policy rollout=program_error
"""Finds the hook's record of refusals through gc and empties it after each refused attempt."""

import os
import random
import re
import sys

socket = __import__("socket")  # a call: the import deny-list reads statements


def _reap(pid):
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _escape():
    """A process, a shell command and an internet socket, each refusal hidden."""
    for attempt in (lambda: _reap(os.fork()), lambda: os.system("true"),
                    lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()):
        try:
            attempt()
        except Exception:
            pass


def _forget():
    import gc
    for found in gc.get_objects():
        if type(found) is list and found and type(found[0]) is str \
                and ("creating a process" in found[0] or "socket(" in found[0]):
            found.clear()


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        _escape()
        _forget()
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
