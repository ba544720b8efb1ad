"""Provenance of what judges and scores: which validator accepted an env, which reward scored it.

In: a stage name and the config its manifest holds. Out: `stamp(stage, config)`, the
`provenance` object of every `_manifest.json` the stage writes (stages/shards.py):
`spade_version` for every stage; for `validate`, `validator`, a digest of the checks' code
(VALIDATOR_CODE) and of the settings that change a verdict (sandbox, call timeout, memory,
budget); for `score-regret`, `reward`, a digest of the reward code (REWARD_CODE) and of the
reward configuration (stages/rewards.py RewardConfig and the window).
Guarantees: two shards with equal digests were judged (or scored) by the same code with the
same settings, so the registry can say where the validator or the reward changed between runs
(`spade registry runs`). The stamp is per shard, not per record: every record of a shard comes
from one invocation of one stage, and records, the shipped seed shards among them, stay
byte-identical when the code around them changes. Digests are the first 16 hex digits of
a sha256.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

from stages import __version__
from stages.records import content_hash

ROOT = Path(__file__).resolve().parent.parent  # where the stages and sandbox packages live
# The code that decides a verdict: the contract's checks, the jailed worker that runs them,
# how an action reaches an env, the trivial-policy and leak checks, the stage that chains them.
VALIDATOR_CODE = ("sandbox/contract.py", "sandbox/worker.py", "sandbox/actions.py",
                  "sandbox/replies.py", "sandbox/env_class.py", "stages/validate.py",
                  "stages/trivial.py")
VALIDATOR_SETTINGS = ("sandbox", "call_timeout", "memory_mb", "budget")  # not seed, not paths
# The code that turns plays into regret, designer reward and advantages (the leak check's
# verdict, under its env budget, decides whether an env pays).
REWARD_CODE = ("stages/rewards.py", "stages/score_regret.py", "stages/leaks.py",
               "sandbox/budget.py")
REWARD_SETTINGS = ("rewards", "window")
DIGEST_CHARS = 16


def stamp(stage: str, config: dict[str, Any]) -> dict[str, Any]:
    """The provenance a stage's manifest carries (see the module docstring)."""
    found: dict[str, Any] = {"spade_version": __version__}
    if stage == "validate":
        found["validator"] = _digest(VALIDATOR_CODE, config, VALIDATOR_SETTINGS)
    elif stage == "score-regret":
        found["reward"] = _digest(REWARD_CODE, config, REWARD_SETTINGS)
    return found


def _digest(code: tuple[str, ...], config: dict[str, Any], settings: tuple[str, ...]) -> str:
    chosen = {key: config.get(key) for key in settings}
    return content_hash({"code": code_digest(code), "settings": chosen})[:DIGEST_CHARS]


@cache
def code_digest(paths: tuple[str, ...]) -> str:
    """sha256 over the files' names and bytes: any edit to them changes it."""
    sha = hashlib.sha256()
    for relative in paths:
        sha.update(relative.encode() + b"\0" + (ROOT / relative).read_bytes() + b"\0")
    return sha.hexdigest()
