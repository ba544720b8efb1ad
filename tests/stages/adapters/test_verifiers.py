"""stages/adapters/verifiers.py: a jailed env as a verifiers 0.4 (v1) taskset + env.

verifiers finds the plugin as it finds its own (by module name, through `__all__`), builds the
env from a config, and loads the taskset's tasks for real here. An episode's `run(task, agents)`
is driven by a scripted player: a stand-in for verifiers' `Agents` whose interaction answers
`turn()` with the env's known actions (verifiers' own player needs a model server, a harness and
an interception server, none of which a CPU test box has); it returns verifiers' own `Segment`
objects, so `last_reply` is read exactly as verifiers reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import types

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed "
                    "(pip install 'spade-selfplay[adapters]')")

from verifiers.v1.agent import Segment  # noqa: E402
from verifiers.v1.utils import loaders  # noqa: E402

from stages.adapters.verifiers import (TASKSET_ID, SpadeEnv, SpadeTaskset,  # noqa: E402
                                       load_environment)
from tests.sandbox.test_gym import GUESS, hostile  # noqa: E402


class ScriptedPlayer:
    """`agents.player`: replies with `script`, one per turn, then ends the exchange."""

    def __init__(self, script: list[str]):
        self.script, self.heard = list(script), []
        self.trace = types.SimpleNamespace(rewards={}, info={}, record_reward=self._record)

    def _record(self, name: str, value: float, weight: float = 1.0) -> None:
        self.trace.rewards[name] = (value, weight)

    @contextlib.asynccontextmanager
    async def interaction(self, task):
        yield self

    async def turn(self, message=None) -> Segment:
        self.heard.append(message)
        if not self.script:
            return Segment(messages=[], terminated=True)
        return Segment(messages=[], root_reply=self.script.pop(0))


def play(env: SpadeEnv, task, script: list[str]) -> ScriptedPlayer:
    player = ScriptedPlayer(script)
    asyncio.run(env.run(task, types.SimpleNamespace(player=player)))
    return player


def test_verifiers_finds_the_plugin_by_its_id():
    assert loaders.taskset_class(TASKSET_ID) is SpadeTaskset
    assert loaders.environment_class(TASKSET_ID) is SpadeEnv


@pytest.mark.parametrize("class_name", ["WaterJugsEnv", "BankTransfersEnv"])
def test_seed_library_env_is_won_with_its_known_actions(class_name, seed_env, known_actions):
    from stages import seed_library

    record = seed_env(class_name)
    env = load_environment(seed_library.ENV_SHARD, id_prefix=record.id[:12], seeds=[5, 6],
                           call_timeout=2)
    tasks = list(env.taskset)
    assert [t.data.info["seed"] for t in tasks] == [5, 6]
    assert tasks[0].data.info == {"env": record.id, "seed": 5, "domain": record.domain}
    prompt = tasks[0].data.prompt
    assert ("Tools:" in prompt) == (record.domain == "tool_use")
    player = play(env, tasks[0], known_actions(record.source, 5))
    assert player.trace.rewards == {"spade_reward": (1.0, 1.0)}
    assert player.trace.info["spade_outcome"] == "ok"
    assert player.script == []  # every known action was played, and the win ended the exchange
    assert player.heard[0] is None  # the model moves first: the prompt is the first observation


def test_a_losing_or_silent_player_scores_zero(nsjail_ok):
    env = load_environment(GUESS, seeds=[3], call_timeout=2)
    task = next(iter(env.taskset))
    assert task.data.prompt.startswith("Guess my number")
    player = play(env, task, ["I think it is \\boxed{21}", "no box here"])
    assert player.trace.rewards["spade_reward"] == (0.0, 1.0)  # the -0.1 format penalty is not
    assert player.trace.info == {"spade_outcome": "ok", "spade_turns": 2}  # an episode reward
    assert player.heard[1].startswith("No, go lower")  # the env's reply is the next user turn


@pytest.mark.parametrize("step, outcome", [("raise ValueError('bad')", "program_error"),
                                           ("while True: pass", "timeout")])
def test_a_misbehaving_env_is_an_outcome_not_a_crash(step, outcome, nsjail_ok):
    env = load_environment(hostile(step), seeds=[0], call_timeout=2)
    task = next(iter(env.taskset))
    player = play(env, task, ["x", "y"])
    assert player.trace.rewards["spade_reward"] == (0.0, 1.0)
    assert player.trace.info["spade_outcome"] == outcome
    assert player.script == ["y"]  # the failure ended the episode after the first move
