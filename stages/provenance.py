"""Provenance: which spade, which validator and which reward judged a record.

In: this installation (the source of the modules that judge envs) and, where a record is
scored, the reward configuration. Out: `stamp(reward=...)`, the dict a judging record carries
as `meta.provenance`: `{"spade": "0.1.0", "validator": "<sha256[:16]>", "reward":
"<sha256[:16]>"}` (`reward` only where a reward configuration scored the record).
Guarantees: the same code and configuration give the same digests on every machine and in
every run; a change to any judging module's source (the checks, the trivial and hint-leak
policies, the jail's reply checks, the base classes the checks compare with) or to any reward
parameter changes its digest, so two runs' records say whether the validator or the reward
changed between them (`spade registry` reads them). The validator digest is computed once a
process.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
from typing import Any

# The modules whose code decides a verdict: a change to any of them is a different validator.
VALIDATOR_MODULES = ("sandbox.contract", "sandbox.env_class", "sandbox.replies",
                     "sandbox.tool_base", "sandbox.reference_tool_base", "stages.trivial",
                     "stages.leaks", "stages.validate")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def validator_digest() -> str:
    """One digest over the judging modules' source, in a fixed order."""
    whole = hashlib.sha256()
    for name in VALIDATOR_MODULES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        whole.update(name.encode() + b"\0")
        if origin:
            with open(origin, "rb") as source:
                whole.update(source.read())
        whole.update(b"\0")
    return whole.hexdigest()[:16]


def reward_digest(config: Any) -> str:
    """A digest of a reward configuration (a dataclass): every field, by name."""
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return digest(json.dumps(fields, sort_keys=True, default=str).encode())


def stamp(reward: Any = None) -> dict[str, str]:
    """`meta.provenance` for a record that judges (validator) or scores (reward too)."""
    from spade_cli import __version__

    found = {"spade": __version__, "validator": validator_digest()}
    if reward is not None:
        found["reward"] = reward_digest(reward)
    return found
