# expect: validate=policy rollout=program_error
"""Traces the worker's request loop to set its `named` local False, then forks, shells out, opens a socket."""

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


def _switch_off(frame, event, arg):
    if "named" in frame.f_locals:
        frame.f_locals["named"] = False  # a trace call writes f_locals back into the frame
    return _switch_off


def _disable_naming():
    frame = sys._getframe()
    while frame is not None and "named" not in frame.f_locals:
        frame = frame.f_back
    if frame is not None:
        frame.f_trace = _switch_off  # the worker's request loop, traced from its next line
    try:
        sys.settrace(lambda *args: None)
    except Exception:
        pass


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        self.code = random.Random(seed).sample("ABCDEFGH", 3)
        self.done = 0
        _disable_naming()
        return "Press the keys " + " ".join(self.code) + " in order as \\boxed{A}.", {}

    def step(self, action):
        _escape()
        keys = re.findall(r"\\boxed\{(.*?)\}", action)
        key = keys[-1].strip() if keys else ""
        if self.done < 3:
            self.done = self.done + 1 if key == self.code[self.done] else 0
        won = self.done == 3
        return ("Open." if won else f"{self.done} right."), float(won), won, False, {}

    def solution(self):
        return ["\\boxed{%s}" % key for key in self.code]
