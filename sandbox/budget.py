"""An env budget: the env seconds a series of calls to one worker may take together.

In: a budget in seconds, then calls (`call(worker, op, **fields)`), as a rollout play makes
them (load, reset and every step) or as `spade hint`'s leak check does (load, then every seed's
reset and steps).
Out: each call's `Reply`; `used` is the env seconds spent so far.
Guarantees: a call never waits longer than what is left of the budget (nor than the worker's
`call_timeout`); a call that times out with less than one `call_timeout` left is outcome
ENV_BUDGET (the budget ran out, not the call's own clock), with a message naming the budget.
An env that spends it is stalled (STALLED): what rollouts blacklist and what score-regret does
not pay.
"""

from __future__ import annotations

import time
from typing import Any

from sandbox.jail import Reply, Worker

ENV_BUDGET = "env_budget"
DEFAULT_ENV_BUDGET = 10.0  # seconds: legitimate envs take milliseconds a step
STALLED = ("timeout", ENV_BUDGET)  # the env ran out the clock: what a hostage env does


class EnvBudget:
    """`seconds` of env time over every call made through it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.used = 0.0

    def call(self, worker: Worker, op: str, **fields: Any) -> Reply:
        left = self.seconds - self.used
        started = time.monotonic()
        reply = worker.call(op, within=left, **fields)
        self.used += time.monotonic() - started
        if reply.outcome == "timeout" and left < worker.limits.call_timeout:
            return Reply(ENV_BUDGET, error={"type": ENV_BUDGET,
                                            "msg": f"the env used its {self.seconds:g}s budget"})
        return reply
