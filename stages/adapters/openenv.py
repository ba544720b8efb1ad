"""A jailed spade env as an OpenEnv (openenv-core 0.3) server-side `Environment`, and its app.

In: a validated env: a `.py` file, a shard (file or directory) of `env` records with an id
prefix, an `env` record, or the source text itself; optionally a `Sandbox` saying how to jail it.
Out:
    openenv_environment(env, ...) -> a subclass of `SpadeEnvironment` (an OpenEnv
        `Environment[SpadeAction, SpadeObservation, SpadeState]`), built for that env; it is
        its own zero-argument factory, so `openenv_environment(env)()` is one instance:
            reset(seed=None, episode_id=None) -> SpadeObservation  the first observation (no
                seed: one derived from the episode id, so a replayed episode id replays)
            step(SpadeAction(message=...)) -> SpadeObservation     one turn
            state -> SpadeState                                     episode id, step count, ...
            close()
    openenv_app(env, ...) -> OpenEnv's FastAPI app (`create_fastapi_app`) serving that class:
        /ws for sessions (one jailed env per connection), /reset /step /state /schema /health.
        At most `max_concurrent_envs` jails live at once, whatever the mix of sessions and
        HTTP /reset calls (each of which OpenEnv serves with an instance of its own): a reset
        that would start one more is refused with HTTP 503 and a `Retry-After` header (over /ws,
        an error message saying the same), rather than queued, since a jail holds up to its
        memory limit (512 MiB) while it lives. OpenEnv's own clients document no retry on a
        503 or 429, and OpenEnv itself refuses a session past the limit without queueing it.
    SpadeAction: `message`, the reply as a model writes it: a game move (sent as
        `\\boxed{move}` unless it holds a `\\boxed{...}`, as rollouts send it) or, for a
        tool-use env, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` or
        `<answer>done</answer>`.
    SpadeObservation: `text` (the env's observation), `reward`, `done`, `outcome` ("ok" or the
        jail outcome that ended the episode), `tools` (a tool-use env's tools, on reset) and
        `metadata` ({"env": name, "turns": n, "outcome": ...}; OpenEnv's wire format drops
        `metadata`, which is why `outcome` and `tools` are fields of their own).

Guarantees (those of stages/adapters/common.py's `Play`):
- The env's code only ever runs inside a jailed `Worker`; this process sees checked JSON data.
- A misbehaving env is an outcome, not a crash: the step that met an exception, a timeout, oom,
  an output limit or a reply of the wrong shape returns `done=True, reward=0.0,
  outcome=<jail outcome>` and one line of text saying so; the next `reset` starts a fresh
  worker if the old one is gone. Only a source that does not load raises (`EnvCrashed`, from
  `openenv_environment`); a jail that cannot start raises `jail.SandboxUnavailable`.
- Rewards are outcome only: each step's reward is 0.0 unless the env terminated on it, then the
  env's reward clipped to [-1, 1], so an episode's summed reward is what `spade rollout` records.
- An episode ends at termination, truncation or `max_turns` (capped at 25); steps after the end
  answer "The episode is over." with `done=True` and reach no env.
"""

from __future__ import annotations

import threading
import uuid
import zlib
from typing import Any

from fastapi import HTTPException, status
from openenv.core.env_server import Action, Environment, Observation, State
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

from sandbox.jail import Sandbox
from stages.adapters.common import EnvFacts, Play, probe, to_action

__all__ = ["SpadeAction", "SpadeEnvironment", "SpadeObservation", "SpadeState", "openenv_app",
           "openenv_environment"]


class SpadeAction(Action):
    message: str = Field(description="Your reply: a game move (as \\boxed{move}) or a tool call "
                         "(<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>)")


class SpadeObservation(Observation):
    text: str = Field(default="", description="What the env says")
    outcome: str = Field(default="ok", description="ok, or how the env failed")
    tools: list[dict[str, Any]] = Field(default_factory=list,
                                        description="A tool-use env's tools (on reset)")


class SpadeState(State):
    env: str = ""
    domain: str = "game"
    max_turns: int = 0
    done: bool = True
    reward: float = 0.0
    outcome: str = "ok"


class SpadeEnvironment(Environment[SpadeAction, SpadeObservation, SpadeState]):
    """Base of the per-env classes `openenv_environment` builds; see the module docstring."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each instance plays in a jail of its own
    _facts: EnvFacts
    _sandbox: Sandbox | None = None
    _jails: JailSlots | None = None  # set by openenv_app: the live jails it allows

    def __init__(self) -> None:
        super().__init__()
        self._play = Play(self._facts, self._sandbox)
        self._episode_id: str | None = None
        self._holds_slot = False

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> SpadeObservation:
        self._take_slot()
        self._episode_id = episode_id or uuid.uuid4().hex
        if isinstance(seed, bool) or not isinstance(seed, int):
            seed = zlib.crc32(self._episode_id.encode())  # the same episode id, the same play
        text = self._play.reset(seed)
        return self._observation(text, tools=self._facts.tools)

    def step(self, action: SpadeAction, timeout_s: float | None = None,
             **kwargs: Any) -> SpadeObservation:
        # timeout_s is not ours to grant: the jail's own call_timeout bounds every step
        message = action.message if isinstance(action, SpadeAction) else str(action)
        return self._observation(self._play.step(to_action(message, self._facts.domain)))

    @property
    def state(self) -> SpadeState:
        play = self._play
        return SpadeState(episode_id=self._episode_id, step_count=play.turns, env=self._facts.name,
                          domain=self._facts.domain, max_turns=self._facts.max_turns,
                          done=play.done, reward=play.reward, outcome=play.outcome)

    def get_metadata(self) -> EnvironmentMetadata:
        facts = self._facts
        return EnvironmentMetadata(name=facts.class_name, version="1.0.0", description=(
            f"spade env {facts.name} ({facts.domain}, at most {facts.max_turns} turns), "
            "played in an nsjail jail"))

    def close(self) -> None:
        self._play.close()
        if self._holds_slot:
            self._holds_slot = False
            self._jails.release()

    def _take_slot(self) -> None:
        """Hold one of the app's jail slots from the first reset until close (HTTP 503 when
        none is free)."""
        if self._jails is None or self._holds_slot:
            return
        if not self._jails.take():
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "1"},
                                detail=f"spade env {self._facts.name}: all {self._jails.limit} "
                                       "jails are in use (max_concurrent_envs); retry when an "
                                       "episode has closed")
        self._holds_slot = True

    def _observation(self, text: str, tools: list[dict] | None = None) -> SpadeObservation:
        play = self._play
        return SpadeObservation(text=text, reward=play.reward, done=play.done,
                                outcome=play.outcome, tools=tools or [], metadata={
                                    "env": self._facts.name, "turns": play.turns,
                                    "outcome": play.outcome})


class JailSlots:
    """At most `limit` jails alive at once across the instances of one served env class."""

    def __init__(self, limit: int):
        self.limit = limit
        self._free = threading.BoundedSemaphore(limit)

    def take(self) -> bool:
        return self._free.acquire(blocking=False)

    def release(self) -> None:
        self._free.release()


def openenv_environment(env: Any, *, id_prefix: str | None = None,
                        sandbox: Sandbox | None = None) -> type[SpadeEnvironment]:
    """A `SpadeEnvironment` subclass for one env (module docstring); call it for an instance.

    Loads and resets the env once in a jail to read its class, domain, max_turns and tools.
    """
    facts = probe(env, id_prefix, sandbox)  # EnvCrashed / SandboxUnavailable propagate
    name = facts.class_name if facts.class_name.isidentifier() else "SpadeEnv"
    return type(name, (SpadeEnvironment,), {"_facts": facts, "_sandbox": sandbox,
                                            "__doc__": f"spade env {facts.name}"})


def openenv_app(env: Any, *, id_prefix: str | None = None, sandbox: Sandbox | None = None,
                max_concurrent_envs: int = 1) -> Any:
    """OpenEnv's FastAPI app over `openenv_environment(env)`, with at most
    `max_concurrent_envs` live jails (module docstring): serve it with uvicorn."""
    from openenv.core.env_server import create_fastapi_app

    cls = openenv_environment(env, id_prefix=id_prefix, sandbox=sandbox)
    cls._jails = JailSlots(max_concurrent_envs)
    return create_fastapi_app(cls, SpadeAction, SpadeObservation,
                              max_concurrent_envs=max_concurrent_envs)
