# expect: validate=resources|reset|determinism|oracle rollout=timeout|program_error|ok
# A play may end ok: which of two waiting readers the kernel gives a request is not promised, and
# once (a fresh-clone CI run, loaded) the worker's own read got every request. Only requests are
# stolen, never replies forged: a theft that misses leaves the play as the env answered it.
"""reset starts a thread that reads the worker's request pipe, stealing its requests."""

import random
import re
import stat
import threading

STEALING = threading.Event()


def request_pipe(os):
    """The read end of a pipe among the inherited descriptors: the worker's requests."""
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.read(fd, 0)  # a write end raises here
                return fd
        except OSError:
            pass
    return None


def steal_forever():
    os = __import__("os")
    fd = request_pipe(os)
    STEALING.set()
    while fd is not None:
        # a blocking read queued before the worker's own: the kernel usually wakes the
        # reader that waited first, so the requests after reset are stolen
        try:
            if not os.read(fd, 1 << 16):
                return
        except OSError:
            return


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
        if not getattr(KeypadEnv, "thief", None):
            KeypadEnv.thief = threading.Thread(target=steal_forever, daemon=True)
            KeypadEnv.thief.start()
            STEALING.wait(5)
            __import__("time").sleep(0.2)  # into its read before the worker reads again
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
