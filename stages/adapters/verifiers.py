"""A jailed spade env as a verifiers (0.4, `verifiers.v1`) taskset and env.

verifiers 0.4 has no `MultiTurnEnv`: a multi-turn game is a `Taskset` (the seeded first
observations) plus an `Env` whose `run(task, agents)` steps the engine as the model's user, as
its own TextArena and OpenEnv tasksets do. This module is such a plugin (it exports one
`Taskset` and one `Env` subclass via `__all__`, which is how verifiers finds them).

In: a validated env: a `.py` file, a shard (file or directory) of `env` records with an id
prefix (`id_prefix`), an `env` record, or the source text; the seeds to play; the jail mode.
Out:
    load_environment(env, seeds=range(8), ...) -> SpadeEnv, a `vf.Env` over a SpadeTaskset
    SpadeTaskset: one task per seed, its prompt the env's first observation (with a tool-use
        env's tools and how to call them), `info` {"env", "seed", "domain"}
    SpadeEnv.run: the model moves first; each reply is sent to the env as `spade rollout`
        sends it (a game reply as its last `\\boxed{...}`, else boxed whole; a tool-use reply as
        written); the env's observation is the next user turn; the episode's end ends the
        exchange. The trace gets reward `spade_reward` (weight 1): the episode reward as a
        rollout scores it, the env's last reward clipped to [-1, 1] if it terminated, else 0.0;
        and `trace.info["spade_outcome"]` ("ok" or the jail outcome) and `["spade_turns"]`.
    verifiers finds a taskset by a top-level module name: importing this module makes it
    `spade_verifiers` too (`--env.taskset.id spade_verifiers --env.taskset.env x.py` in a
    process that imported it).

Guarantees (those of stages/adapters/common.py's `Play`):
- The env's code only ever runs inside a jailed `Worker`; this process sees checked JSON data.
  Jail calls block, so they run in a thread (`asyncio.to_thread`), never on the event loop.
- A misbehaving env is an outcome, not a crash: an exception, timeout, oom, output limit or
  wrong-shaped reply ends the episode with `spade_reward` 0.0 and the outcome recorded; the
  episode's run returns normally. Only a source that does not load raises (`EnvCrashed`, when
  the taskset loads); a jail that cannot start raises `jail.SandboxUnavailable`.
- An episode ends at termination, truncation or `max_turns` (capped at 25, as rollouts are).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import verifiers.v1 as vf

from sandbox.jail import Limits, Sandbox
from stages.adapters.common import EnvFacts, Play, probe, to_action, tools_text

__all__ = ["SpadeEnv", "SpadeEnvConfig", "SpadeTaskset", "SpadeTasksetConfig",
           "load_environment"]

# verifiers imports a taskset by a top-level module name (it cannot resolve a dotted one), so
# this module is also importable, once imported, as `spade_verifiers`
TASKSET_ID = "spade_verifiers"
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])


class SpadeTasksetConfig(vf.TasksetConfig):
    env: str = ""
    """The env: a `.py` file, a shard (file or directory) of env records, or the source."""
    id_prefix: str | None = None
    """Which env record of the shard (an id prefix is enough)."""
    seeds: list[int] = list(range(8))
    """One task per seed, passed to the env's reset."""
    hint: bool = False
    """Append the record's hint to the first observation, as a hinted rollout does."""
    sandbox: Literal["nsjail", "none"] = "nsjail"
    """How to jail the env: nsjail, or none (NOT a security boundary)."""
    call_timeout: float | None = None
    """Seconds one env call may take (default: the jail's)."""


class SpadeData(vf.TaskData):
    info: dict
    """The env's name, the seed its reset gets, and its domain."""


class SpadeTask(vf.Task[SpadeData, vf.State, vf.TaskConfig]):
    pass


def _sandbox(config: SpadeTasksetConfig) -> Sandbox:
    if config.call_timeout is None:
        return Sandbox(mode=config.sandbox)
    return Sandbox(mode=config.sandbox, limits=Limits(call_timeout=config.call_timeout))


class SpadeTaskset(vf.Taskset[SpadeTask, SpadeTasksetConfig]):
    def load(self) -> Iterator[SpadeTask]:
        config = self.config
        sandbox = _sandbox(config)
        facts = probe(config.env, config.id_prefix, sandbox)
        play = Play(facts, sandbox)  # one jail serves every seed's first observation
        try:
            for seed in config.seeds:
                yield SpadeTask(SpadeData(name=f"{facts.name}#{seed}",
                                          prompt=first_prompt(play, facts, seed, config.hint),
                                          info={"env": facts.name, "seed": seed,
                                                "domain": facts.domain}), config.task)
        finally:
            play.close()


def first_prompt(play: Play, facts: EnvFacts, seed: int, hint: bool) -> str:
    """What the model reads first: the observation, the hint if asked, a tool-use env's tools."""
    text = play.reset(seed)
    if hint and facts.hint:
        text = f"{text}\n\nHINT: {facts.hint}"
    if facts.domain == "tool_use":
        text = f"{text}\n\n{tools_text(facts.tools)}"
    else:
        text += "\n\nAnswer with your move as \\boxed{move}."
    return text


class SpadeEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class SpadeEnv(vf.Env[SpadeEnvConfig]):
    async def run(self, task: SpadeTask, agents: Any) -> None:
        config: SpadeTasksetConfig = self.taskset.config
        sandbox = _sandbox(config)
        facts = await asyncio.to_thread(self._facts, config, sandbox)
        play = Play(facts, sandbox)
        try:
            await asyncio.to_thread(play.reset, task.data.info["seed"])
            async with agents.player.interaction(task) as interaction:
                await play_out(play, interaction)
        finally:
            await asyncio.to_thread(play.close)
        trace = interaction.trace
        trace.record_reward("spade_reward", play.reward, 1.0)
        trace.info["spade_outcome"] = play.outcome
        trace.info["spade_turns"] = play.turns

    def _facts(self, config: SpadeTasksetConfig, sandbox: Sandbox) -> EnvFacts:
        # probed once per SpadeEnv, not once per episode: a jail start saved per play
        if getattr(self, "_probed", None) is None:
            self._probed = probe(config.env, config.id_prefix, sandbox)
        return self._probed


async def play_out(play: Play, interaction: Any) -> None:
    """The model moves first (the prompt is the first observation); each reply is one env step,
    each observation the next user turn, until the episode or the exchange ends."""
    segment = await interaction.turn()
    while not segment.terminated:
        action = to_action(segment.last_reply, play.facts.domain)
        observation = await asyncio.to_thread(play.step, action)
        if play.done:
            break  # the episode is over: end the exchange
        segment = await interaction.turn(observation)


def load_environment(env: Any, *, id_prefix: str | None = None,
                     seeds: Iterable[int] = range(8), hint: bool = False,
                     sandbox: Literal["nsjail", "none"] = "nsjail",
                     call_timeout: float | None = None, **env_config: Any) -> SpadeEnv:
    """A `SpadeEnv` over a `SpadeTaskset` of `env` (a path; see the module docstring).

    `env_config` goes to `SpadeEnvConfig` (e.g. `player=vf.AgentConfig(...)`).
    """
    source = env.source if hasattr(env, "source") else str(env)  # config fields are text
    taskset = SpadeTasksetConfig(id=TASKSET_ID, env=source, id_prefix=id_prefix,
                                 seeds=list(seeds), hint=hint, sandbox=sandbox,
                                 call_timeout=call_timeout)
    return SpadeEnv(SpadeEnvConfig(taskset=taskset, **env_config))
