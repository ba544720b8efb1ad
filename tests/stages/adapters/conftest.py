"""Fixtures for the adapter tests: can a jail run here, real envs, and their known solutions.

`seed_env("WaterJugsEnv")` is an env record from stages/seed_library; `known_actions(source,
seed)` asks the env itself, in a jail, for its `solution()` after `reset(seed)`: the actions a
scripted policy plays to a win.
"""

from __future__ import annotations

import pytest

from sandbox.jail import Limits, Sandbox, Worker


@pytest.fixture(scope="session")
def seed_env():
    from stages import seed_library
    from stages.records import Env
    from stages.shards import read

    records = {e.class_name: e for e in read([str(seed_library.ENV_SHARD)]) if isinstance(e, Env)}
    return records.__getitem__


@pytest.fixture(scope="session")
def known_actions(nsjail_ok):
    def solve(source: str, seed: int) -> list[str]:
        with Worker(Sandbox(limits=Limits(call_timeout=10))) as worker:
            for op, fields in (("load", {"source": source}), ("reset", {"seed": seed})):
                assert worker.call(op, **fields).ok
            reply = worker.call("solution")
            assert reply.ok, reply.error
            return list(reply.result)

    return solve


@pytest.fixture(scope="session")
def as_call():
    """`<tool_call>{"name": n, "arguments": a}</tool_call>` -> (n, a); anything else -> None."""
    import json
    import re

    def parse(action: str):
        found = re.fullmatch(r"<tool_call>(.*)</tool_call>", action.strip(), re.S)
        if found is None:
            return None
        call = json.loads(found.group(1))
        return call["name"], call.get("arguments", {})

    return parse
