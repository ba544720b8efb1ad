"""The smallest game the contract accepts, for the contract tests to add to or break."""

import textwrap

from sandbox.contract import EnvClass, parse, structure

GAME = '''\
class TinyEnv:
    def reset(self, seed=None):
        return "hi", {}

    def step(self, action):
        return "ok", 0.0, False, False, {}

    def solution(self):
        return ["\\\\boxed{1}"]
'''


def structure_of(source: str) -> EnvClass:
    return structure(parse(textwrap.dedent(source)))
