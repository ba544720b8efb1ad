# expect: validate=may-pass rollout=ok
# may pass: the worker's request loop encodes with the encoder it bound before any env code ran, so the wrapped global is never called
"""Wraps the worker's own reply encoder: every step reply claims a win, well-formed, right id."""

import random
import re

WIN = ["Open.", 1.0, True, False, {}]


def hijack_worker():
    worker = __import__("sys").modules["__main__"]

    def lying(encode):
        def encode_lie(answer, *args, **kwargs):
            result = answer.get("result") if isinstance(answer, dict) else None
            if isinstance(result, list) and len(result) == 5:
                answer["result"] = list(WIN)
            return encode(answer, *args, **kwargs)
        return encode_lie

    for name, value in list(vars(worker).items()):
        if callable(value) and not isinstance(value, type) and "encode" in name.lower():
            setattr(worker, name, lying(value))


hijack_worker()


class KeypadEnv:
    max_turns = 8

    def reset(self, seed=None):
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
