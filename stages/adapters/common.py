"""What every adapter shares: finding an env's source, probing it once, and playing episodes.

In: a validated env as a user names it: a `.py` path, a shard (file or directory) of `env`
records plus an id prefix, a `stages.records.Env`, or the source text itself; optionally a
`Sandbox` saying how to jail it.
Out:
    env_source(env, id_prefix) -> EnvSource(name, source, hint)
    probe(env, id_prefix, sandbox) -> EnvFacts   class, domain, max_turns (capped), tools
    Play(facts, sandbox)                         one episode at a time over a `JailedEnv`:
        reset(seed) -> str, step(text) -> str, and plain attributes
        outcome, turns, done, reward, env (the `JailedEnv`, or None when it is gone)
    to_action(text, domain) -> str               what the env receives for a reply, as
                                                 `spade rollout` sends it
    tools_text(tools) -> str                     a tool list as lines a model can read

Guarantees:
- The env's code only ever runs inside a jailed `Worker` (through sandbox/gym.py's
  `JailedEnv`); this process sees its replies as checked JSON data.
- A misbehaving env is an outcome, not a crash: an exception in the env, a timeout, oom, an
  output limit or a reply of the wrong shape ends the episode; `Play.step` returns one line
  saying so, `outcome` holds the jail outcome (`jail.OUTCOMES`), `reward` is 0.0, and the next
  `reset` starts a fresh worker if the old one is gone. Only a source that does not load raises
  (`EnvCrashed`, from `probe`), and a jail that cannot start raises `jail.SandboxUnavailable`.
- Rewards are outcome only, as a rollout scores an episode: `reward` is the env's last reward
  clipped to [-1, 1] once it terminated, else 0.0.
- An episode ends at termination, truncation or `max_turns` (capped at 25, as rollouts are);
  later steps answer "The episode is over." and reach no env.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.gym import MAX_TURNS_CAP, EnvCrashed, JailedEnv
from sandbox.jail import Sandbox

__all__ = ["EnvFacts", "EnvSource", "OVER", "Play", "env_source", "probe", "to_action",
           "tools_text"]

OVER = "The episode is over."


@dataclass(frozen=True)
class EnvSource:
    name: str  # the file or the env id, for messages
    source: str
    hint: str | None = None


@dataclass(frozen=True)
class EnvFacts:
    name: str
    source: str
    hint: str | None
    class_name: str
    domain: str  # "game" or "tool_use"
    max_turns: int  # already capped at MAX_TURNS_CAP
    tools: list[dict] = field(default_factory=list)  # [{"type": "function", "function": {...}}]


def env_source(env: Any, id_prefix: str | None = None) -> EnvSource:
    """The source of a .py path, a shard path + id prefix, an `Env` record, or source text."""
    if hasattr(env, "source") and hasattr(env, "id"):  # a stages.records.Env
        return EnvSource(env.id, env.source, getattr(env, "hint", None))
    text = str(env)
    if "\n" in text:  # source text: no path holds a newline
        return EnvSource("<source>", text)
    if text.endswith(".py"):
        return EnvSource(text, Path(text).read_text())
    from stages.shards import find_shards, read_shard

    envs = [r for shard in find_shards([text], {"env"}) for r in read_shard(shard)
            if r.kind == "env" and (id_prefix is None or r.id.startswith(id_prefix))]
    if len(envs) != 1:
        raise ValueError(f"{text}: {len(envs)} env records match id prefix {id_prefix!r}; "
                         "exactly one must")
    return EnvSource(envs[0].id, envs[0].source, envs[0].hint)


def probe(env: Any, id_prefix: str | None = None, sandbox: Sandbox | None = None) -> EnvFacts:
    """Load and reset the env once in a jail to read its class, domain, max_turns and tools."""
    found = env_source(env, id_prefix)
    jailed = JailedEnv(found.source, sandbox)  # EnvCrashed / SandboxUnavailable propagate
    try:
        _obs, info = jailed.reset(seed=0)
    finally:
        jailed.close()
    turns = jailed.max_turns
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        turns = MAX_TURNS_CAP
    tools = info.get("tools", []) if jailed.domain == "tool_use" else []
    tools = [t for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
             and isinstance(t["function"].get("name"), str)]
    return EnvFacts(found.name, found.source, found.hint, jailed.class_name, jailed.domain,
                    min(turns, MAX_TURNS_CAP), tools)


def to_action(text: str, domain: str) -> str:
    """A game reply goes as `\\boxed{...}` (its last box, or the whole reply boxed); a tool-use
    reply goes as typed, as `spade rollout` and `spade play` send them."""
    if domain == "tool_use":
        return text
    from stages.rollout import game_action, last_boxed

    return game_action(text) if last_boxed(text) is not None else f"\\boxed{{{text.strip()}}}"


def tools_text(tools: list[dict]) -> str:
    """The tools as JSON lines and how to call one, for a model that reads plain text."""
    lines = ["Tools:"] + [json.dumps(tool["function"], sort_keys=True) for tool in tools]
    example = json.dumps({"name": "NAME", "arguments": {"key": "value"}})
    lines.append(f"Call one as <tool_call>{example}</tool_call>; finish with "
                 "<answer>done</answer>.")
    return "\n".join(lines)


class Play:
    """Episodes of one env, one at a time, over a lazily started `JailedEnv` (module doc)."""

    def __init__(self, facts: EnvFacts, sandbox: Sandbox | None = None):
        self.facts, self.sandbox = facts, sandbox
        self.env: JailedEnv | None = None
        self.outcome, self.turns, self.done, self.reward = "ok", 0, True, 0.0

    def reset(self, seed: int) -> str:
        self.outcome, self.turns, self.done, self.reward = "ok", 0, False, 0.0
        try:
            if self.env is None:  # started here, not in __init__: a jail only once it plays
                self.env = JailedEnv(self.facts.source, self.sandbox)
            observation, _info = self.env.reset(seed=seed)
            return observation
        except EnvCrashed as exc:
            return self._crashed(exc)

    def step(self, action: str) -> str:
        """One turn with `action` sent exactly as given (see `to_action`)."""
        if self.done:
            return OVER
        try:
            observation, reward, terminated, truncated, _info = self.env.step(action)
        except EnvCrashed as exc:
            return self._crashed(exc)
        self.turns += 1
        self.reward = reward  # JailedEnv pays outcome only: 0.0 unless terminated, clipped
        if terminated or truncated or self.turns >= self.facts.max_turns:
            self.done = True
            observation += "\n" + OVER
        return observation

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()

    def _crashed(self, exc: EnvCrashed) -> str:
        self.outcome, self.done, self.reward = exc.outcome, True, 0.0
        if exc.outcome != "program_error":
            self.close()  # the worker is gone: the next reset starts a fresh one
        return f"The environment failed ({exc.outcome}): {exc.message}. {OVER}"

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the jail module's atexit hook kills workers
            pass
