"""stages/adapters/trl.py driven by a scripted policy through the calls trl 1.16's GRPOTrainer
makes.

Mirrors trl/trainer/grpo_trainer.py: `__init__` probes `factory()` and lists the tools with
`inspect.getmembers(type(instance), predicate=inspect.isfunction)` minus reset/get_reward/_*;
`_generate_and_score_completions` calls `environment.reset(**row)` and keys tools by
`tool.__name__`; `_tool_call_loop` calls `tool_dict[name](**function["arguments"])` and wraps
an exception as {"error": ...}; the env reward source calls `e.get_reward()`. The chat template
renders each tool with transformers' `get_json_schema`.
"""

from __future__ import annotations

import inspect
import json
import re

import pytest
from transformers.utils import get_json_schema

from sandbox.jail import Limits, Sandbox
from stages.adapters.trl import SpadeTRLEnv, environment_factory
from tests.sandbox.test_gym import GUESS, TOOLS, hostile

SANDBOX = Sandbox(limits=Limits(call_timeout=2))


def trl_tools(instance) -> dict:
    """{tool.__name__: bound method}, as GRPOTrainer builds `_sync_tool_dicts`."""
    methods = [getattr(instance, name) for name, _ in
               inspect.getmembers(type(instance), predicate=inspect.isfunction)
               if name not in ("reset", "get_reward") and not name.startswith("_")]
    return {method.__name__: method for method in methods}


def call(tools: dict, name: str, arguments: dict):
    try:  # as _tool_call_loop does
        return tools[name](**arguments)
    except Exception as exc:
        return {"error": str(exc)}


def test_game_env_scripted_policy_wins_and_scores_like_a_rollout(nsjail_ok):
    factory = environment_factory(GUESS, sandbox=SANDBOX)
    env = factory()
    tools = trl_tools(env)
    assert list(tools) == ["act"]
    schema = get_json_schema(tools["act"])["function"]
    assert schema["name"] == "act" and schema["parameters"]["required"] == ["action"]
    row = {"prompt": [{"role": "user", "content": "Play."}], "seed": 3}
    first = env.reset(**row)
    assert first.startswith("Guess my number")
    # scripted policy: try each number of the right parity until the game says Correct
    parity = 0 if "even" in first else 1
    wins = 0
    for n in range(1, 21):
        if n % 2 != parity or env.done:
            continue
        reply = call(tools, "act", {"action": str(n)})
        wins += reply.startswith("Correct!")
    assert wins == 1 and env.get_reward() == 1.0 and env.outcome == "ok"
    assert call(tools, "act", {"action": "5"}) == "The episode is over."
    env.reset(**row)  # a reused instance starts over, same seed same episode
    assert env.get_reward() == 0.0 and not env.done
    call(tools, "act", {"action": "no box"})
    assert env.get_reward() == 0.0  # the env's -0.1 format penalty is not a TRL reward


def test_tool_use_env_tools_schema_and_solution(nsjail_ok):
    env = environment_factory(TOOLS, sandbox=SANDBOX)()
    assert isinstance(env, SpadeTRLEnv)
    tools = trl_tools(env)
    assert sorted(tools) == ["add", "finish"]
    add = get_json_schema(tools["add"])["function"]
    assert add["description"] == "add n"
    assert add["parameters"] == {"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer", "description": "the n"}}}
    assert env.reset(prompt=[{"role": "user", "content": "Go."}]).startswith("Request 1 of 2")
    solution = ['<tool_call>{"name": "add", "arguments": {"n": 3}}</tool_call>',
                '<tool_call>{"name": "add", "arguments": {"n": 2}}</tool_call>']
    for action in solution:  # what TRL's response parser gives for these completions
        parsed = json.loads(re.search(r"<tool_call>(.*)</tool_call>", action).group(1))
        call(tools, parsed["name"], parsed["arguments"])
    assert env.get_reward() == 0.0  # progress is not paid: outcome only
    assert call(tools, "finish", {}) == "All requests completed.\nThe episode is over."
    assert env.get_reward() == 1.0
    assert "error" in call(tools, "add", {"m": 1}) or env.done  # TypeError or over


def test_misbehaving_env_is_an_outcome_and_the_next_reset_recovers(nsjail_ok):
    source = hostile("while True: pass")
    env = environment_factory(source, sandbox=SANDBOX)()
    tools = trl_tools(env)
    env.reset(seed=0)
    reply = call(tools, "act", {"action": "x"})
    assert reply.startswith("The environment failed (timeout)")
    assert (env.outcome, env.done, env.get_reward()) == ("timeout", True, 0.0)
    assert env.reset(seed=0) == "ok" and env.outcome == "ok"  # a fresh worker
    raising = environment_factory(hostile("raise ValueError('bad')"), sandbox=SANDBOX)()
    raising.reset(seed=0)
    assert "program_error" in raising.act("x") and raising.get_reward() == 0.0


def test_a_source_that_does_not_load_raises_at_the_factory(nsjail_ok):
    from sandbox.gym import EnvCrashed

    with pytest.raises(EnvCrashed):
        environment_factory("class Broken(:\n", sandbox=SANDBOX)


def test_an_env_record_from_the_seed_library(nsjail_ok):
    from stages import seed_library
    from stages.records import Env
    from stages.shards import read

    record = next(e for e in read([str(seed_library.ENV_SHARD)]) if isinstance(e, Env))
    env = environment_factory(record, sandbox=SANDBOX)()
    assert isinstance(env.reset(seed=1), str) and trl_tools(env)


@pytest.mark.parametrize("class_name", ["WaterJugsEnv", "BankTransfersEnv"])
def test_seed_library_env_from_its_shard_is_won_with_its_known_actions(
        class_name, seed_env, known_actions, as_call):
    from stages import seed_library

    record = seed_env(class_name)
    factory = environment_factory(str(seed_library.ENV_SHARD), id_prefix=record.id[:12],
                                  sandbox=SANDBOX)
    env = factory()
    tools = trl_tools(env)
    env.reset(prompt=[{"role": "user", "content": "Play."}], seed=5)
    for action in known_actions(record.source, 5):
        if record.domain == "game":
            reply = call(tools, "act", {"action": action})  # "\boxed{fill A}" goes as it is
        elif action == "<answer>done</answer>":
            reply = call(tools, "finish", {})
        else:
            name, arguments = as_call(action)  # what TRL's parser hands the tool
            reply = call(tools, name, arguments)
        assert isinstance(reply, str), reply
    assert (env.done, env.outcome, env.get_reward()) == (True, "ok", 1.0)
    assert reply.endswith("The episode is over.")
