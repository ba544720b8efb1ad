"""A jailed env program as a `gymnasium.Env`, so gymnasium wrappers and `check_env` work on it.

In: an env program's source (the text a designer wrote: a class ending in `Env` with
`reset(seed)`, `step(action)`, `solution()`, or a `ToolUseBaseEnv` subclass), and optionally a
`Sandbox` saying how to jail it.
Out: `JailedEnv`, a `gymnasium.Env[str, str]`:
    reset(seed=None, options=None) -> (obs: str, info: dict)
    step(action: str) -> (obs: str, reward: float, terminated: bool, truncated: bool, info: dict)
    close()
with `observation_space` and `action_space` both `AnyText()` (every str is a member: spaces,
Unicode, empty, any length; gymnasium's own `Text` rejects most of these), and
`register(env_id, source)`, after which `gymnasium.make(env_id)` builds a `JailedEnv` wrapped in
`TimeLimit(max_episode_steps=max_turns)`.

Rewards are outcome only, as `spade rollout` scores an episode: a step pays 0.0 unless the env
terminates on it, and then the env's reward clipped to [-1, 1]. So the return of an episode is
exactly the episode reward a rollout records (the env's final reward for an episode it ends,
e.g. 1.0 for a win; 0.0 for one cut off by a time limit, whatever the env paid on the way), and
a policy cannot farm it. (A tool-use env pays
its progress fraction on every call: summed, those paid a policy that does 3 of 4 requests and
then repeats a read call until the time limit several times what a solver got.)
The env's own per-step reward (a tool-use env's progress, a format penalty) stays available as
`info["env_reward"]`, for anyone who wants to shape rewards with a wrapper.

Guarantees:
- The env's code only ever runs inside the jailed `Worker` (sandbox/jail.py); this process sees
  its replies as JSON data. Each call is bounded by `Limits.call_timeout`, as `Worker.call` is.
- Any non-ok reply raises `EnvCrashed(outcome, message, error)`, with `outcome` one of
  `jail.OUTCOMES` ("program_error", "timeout", "oom", "output_limit"); a reply of the wrong shape
  (a non-str observation, a non-dict info, a non-number reward, not a 2- or 5-tuple) is a
  `program_error` already (the Worker checks every reply: sandbox/replies.py), so it raises
  `EnvCrashed("program_error", ...)` too. After a timeout, oom, output_limit or a worker death the
  worker is gone and every later call raises the same `EnvCrashed`; after an exception inside the
  env's own code the worker lives on and `reset` may be called again.
- A jail that cannot start or breaks underneath us raises `jail.SandboxUnavailable`
  (infrastructure, exit 69), never `EnvCrashed`.
- `reset(seed=s)` passes `s` to the env; `reset()` without a seed passes a seed drawn from
  `self.np_random`, so a seeded reset followed by unseeded ones is reproducible, as gymnasium
  expects. Deterministic env programs therefore pass `check_env`.
- `close()` is idempotent and kills the worker; a `JailedEnv` that is garbage-collected unclosed
  closes its worker too.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from sandbox.jail import Reply, Sandbox, SandboxUnavailable, Worker

__all__ = ["AnyText", "EnvCrashed", "JailedEnv", "register"]

MAX_TURNS_CAP = 25  # same cap as sandbox.contract.MAX_TURNS_CAP (rollouts never run longer)
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "


class EnvCrashed(RuntimeError):
    """The jailed env did not answer normally: `outcome` says how (see jail.OUTCOMES)."""

    def __init__(self, outcome: str, message: str, error: dict | None = None):
        super().__init__(f"{outcome}: {message}")
        self.outcome, self.message, self.error = outcome, message, error or {}


class AnyText(spaces.Space[str]):
    """The space of all Python strings. `sample()` gives a short random printable string."""

    def __init__(self, max_sample_length: int = 16, seed: int | np.random.Generator | None = None):
        if max_sample_length < 1:
            raise ValueError("max_sample_length must be at least 1")
        self.max_sample_length = int(max_sample_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return isinstance(x, str)

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        if mask is not None or probability is not None:
            raise NotImplementedError("AnyText.sample takes no mask or probability")
        length = int(self.np_random.integers(1, self.max_sample_length + 1))
        picks = self.np_random.integers(0, len(SAMPLE_CHARSET), size=length)
        return "".join(SAMPLE_CHARSET[int(i)] for i in picks)

    def to_jsonable(self, sample_n: Any) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[Any]) -> list[str]:
        return list(sample_n)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyText) and other.max_sample_length == self.max_sample_length

    def __hash__(self) -> int:
        return hash(("AnyText", self.max_sample_length))

    def __repr__(self) -> str:
        return f"AnyText(max_sample_length={self.max_sample_length})"


def _crash(reply: Reply) -> Exception:
    error = reply.error or {}
    message = error.get("msg") or error.get("type") or "no detail"
    if reply.outcome == "sandbox_failure":
        return SandboxUnavailable(message)
    return EnvCrashed(reply.outcome, message, error)


class JailedEnv(gymnasium.Env[str, str]):
    """One env program in one jailed worker, started on construction."""

    metadata = {"render_modes": []}

    def __init__(self, source: str, sandbox: Sandbox | None = None,
                 render_mode: str | None = None):
        if render_mode is not None:
            raise ValueError(f"JailedEnv renders nothing (render_mode={render_mode!r})")
        self.render_mode = None
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self._worker: Worker | None = None
        worker = Worker(sandbox)
        worker.start()  # SandboxUnavailable propagates
        self._worker = worker
        reply = worker.call("load", source=source)
        if not reply.ok:
            self.close()
            raise _crash(reply)
        facts = reply.result  # a dict: sandbox/replies.py checked it
        self.class_name: str = facts.get("class_name", "?")
        self.domain: str = facts.get("domain", "game")
        self.max_turns: int | None = facts.get("max_turns")

    # -- the gymnasium API -------------------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        env_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        obs, info = self._call("reset", seed=env_seed).result  # [str, dict], checked by the Worker
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"actions are str, got {type(action).__name__}")
        # [str, finite number, bool, bool, dict]: the Worker checked the reply's types
        obs, reward, terminated, truncated, info = self._call("step", action=action).result
        outcome = max(-1.0, min(1.0, float(reward))) if terminated else 0.0
        return obs, outcome, terminated, truncated, {**info, "env_reward": float(reward)}

    def render(self) -> None:
        return None

    def close(self) -> None:
        worker, self._worker = getattr(self, "_worker", None), None
        if worker is not None:
            worker.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the jail module's atexit hook kills workers
            pass

    # -- internals ---------------------------------------------------------------------------
    def _call(self, op: str, **fields: Any) -> Reply:
        if self._worker is None:
            raise EnvCrashed("program_error", "the env is closed", {"type": "closed"})
        reply = self._worker.call(op, **fields)
        if not reply.ok:
            raise _crash(reply)
        return reply


def register(env_id: str, source: str, sandbox: Sandbox | None = None,
             max_episode_steps: int | None = None, **register_kwargs: Any) -> int | None:
    """Register `source` so `gymnasium.make(env_id)` builds a `JailedEnv` of it.

    `max_episode_steps` defaults to the env's `max_turns` (read by loading the source once in a
    jail; None becomes, and larger values are capped at, MAX_TURNS_CAP, as validation does), so
    the `TimeLimit` wrapper truncates where rollouts would. Returns the step limit used. Raises
    `EnvCrashed` if the source does not load, `SandboxUnavailable` if no jail can start.
    """
    if max_episode_steps is None:
        env = JailedEnv(source, sandbox)
        try:
            turns = env.max_turns
        finally:
            env.close()
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            turns = MAX_TURNS_CAP
        max_episode_steps = min(turns, MAX_TURNS_CAP)
    gymnasium.register(id=env_id, entry_point="sandbox.gym:JailedEnv",
                       max_episode_steps=max_episode_steps,
                       kwargs={"source": source, "sandbox": sandbox}, **register_kwargs)
    return max_episode_steps
