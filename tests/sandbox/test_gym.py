"""sandbox/gym.py: a jailed env program as a gymnasium.Env, checked with gymnasium's own tools."""

from __future__ import annotations

import secrets
import string
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from sandbox.gym import AnyText, EnvCrashed, JailedEnv, register
from sandbox.jail import Limits, Sandbox

SANDBOX = Sandbox(limits=Limits(call_timeout=2))

GUESS = '''
import random
import re

BOXED = re.compile(r"\\\\boxed\\{(.*?)\\}")


class GuessEnv:
    """Guess a hidden number in 1..20; deterministic for a given seed."""
    max_turns = 6

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.target = self.rng.randint(1, 20)
        self.turns = 0
        parity = "even" if self.target % 2 == 0 else "odd"
        return f"Guess my number (1-20). Hint: it is {parity}.", {"turn": 0}

    def step(self, action):
        self.turns += 1
        found = BOXED.findall(action) if isinstance(action, str) else []
        truncated = self.turns >= self.max_turns
        if not found or not found[-1].strip().isdigit():
            return "Answer as \\\\boxed{n}.", -0.1, False, truncated, {"turn": self.turns}
        guess = int(found[-1])
        if guess == self.target:
            return "Correct!", 1.0, True, False, {"turn": self.turns}
        word = "higher" if guess < self.target else "lower"
        return f"No, go {word}.", 0.0, False, truncated, {"turn": self.turns}

    def solution(self):
        return [f"\\\\boxed{{{self.target}}}"]
'''

# never truncates by itself: only gymnasium's TimeLimit (max_turns) ends its episodes
ENDLESS = '''
class EndlessEnv:
    max_turns = 4

    def reset(self, seed=None):
        self.n = 0
        return "start", {}

    def step(self, action):
        self.n += 1
        return f"step {self.n}: {action}", 0.0, False, False, {"n": self.n}

    def solution(self):
        return ["go"]
'''

TOOLS = '''
class CounterEnv(ToolUseBaseEnv):
    max_turns = 5

    def setup(self):
        self.tools = {"add": {"description": "add n", "parameters": {"type": "object",
                      "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
        self.state = {"total": 0}
        self.instructions = ["Make the total 3.", "Now make it 5."]
        self.criteria = [lambda s: s["total"] == 3, lambda s: s["total"] == 5]

    def tool_add(self, n):
        self.state["total"] += int(n)
        return f"total={self.state['total']}"

    def solution(self):
        return ['<tool_call>{"name": "add", "arguments": {"n": 3}}</tool_call>',
                '<tool_call>{"name": "add", "arguments": {"n": 2}}</tool_call>',
                "<answer>done</answer>"]
'''


def hostile(step: str) -> str:
    return ("import os, time\n\nclass BadEnv:\n    max_turns = 3\n\n"
            "    def reset(self, seed=None):\n        return 'ok', {}\n\n"
            "    def solution(self):\n        return ['x']\n\n"
            f"    def step(self, action):\n        {step}\n")


@pytest.fixture
def jailed(nsjail_ok):
    made: list[JailedEnv] = []

    def make(source: str = GUESS, sandbox: Sandbox = SANDBOX) -> JailedEnv:
        env = JailedEnv(source, sandbox)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def unique_id(name: str) -> str:
    return f"spade-test/{name}-{secrets.token_hex(4)}-v0"


# -- AnyText -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["go north", "", "Ω", "x" * 10000, " \t\n", "🂡 ≈ ç √",
                                  "\\boxed{42}", "\x00"])
def test_anytext_contains_every_str(text):
    assert AnyText().contains(text)
    assert text in AnyText()


@pytest.mark.parametrize("value", [None, 1, 1.5, b"bytes", ["a"], ("a",), {"a": 1},
                                   np.array(["a"])])
def test_anytext_rejects_non_str(value):
    assert not AnyText().contains(value)


def test_anytext_sample_is_short_printable_and_seeded():
    first, second = AnyText(seed=7), AnyText(seed=7)
    samples = [first.sample() for _ in range(50)]
    assert samples == [second.sample() for _ in range(50)]
    assert len(set(samples)) > 40
    for sample in samples:
        assert isinstance(sample, str) and 1 <= len(sample) <= 16 and sample in first
        assert all(ch in string.printable and ch not in "\t\n\r\x0b\x0c" for ch in sample)
    first.seed(7)
    assert first.sample() == samples[0]
    assert AnyText() == AnyText() and AnyText(8) != AnyText(16)
    assert AnyText().to_jsonable(["a", "b"]) == ["a", "b"]


# -- JailedEnv -----------------------------------------------------------------------------------

def test_check_env_passes(jailed):
    env = jailed()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    unexpected = [str(w.message) for w in caught
                  if "Not able to test alternative render modes" not in str(w.message)]
    assert unexpected == []


def test_check_env_passes_through_make(nsjail_ok):
    env_id = unique_id("Guess")
    register(env_id, GUESS, SANDBOX)
    env = gymnasium.make(env_id)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)  # with a spec: also makes, closes and re-closes an env
        assert [str(w.message) for w in caught] == []
    finally:
        env.close()


def test_seeded_resets_are_reproducible(jailed):
    env = jailed()
    obs_a, info_a = env.reset(seed=5)
    after_a = [env.reset()[0] for _ in range(3)]
    obs_b, info_b = env.reset(seed=5)
    after_b = [env.reset()[0] for _ in range(3)]
    assert (obs_a, info_a, after_a) == (obs_b, info_b, after_b)
    assert {env.reset(seed=s)[0] for s in range(20)} == {
        "Guess my number (1-20). Hint: it is even.", "Guess my number (1-20). Hint: it is odd."}


def test_step_types_and_solution_play(jailed):
    env = jailed()
    assert env.class_name == "GuessEnv" and env.domain == "game" and env.max_turns == 6
    obs, info = env.reset(seed=3)
    assert isinstance(obs, str) and info == {"turn": 0}
    obs, reward, terminated, truncated, info = env.step("no box here Ω")
    assert (obs, reward, terminated, truncated) == ("Answer as \\boxed{n}.", 0.0, False, False)
    assert type(reward) is float and info == {"turn": 1, "env_reward": -0.1}
    hits = [n for n in range(1, 21) if env.reset(seed=3) and env.step(f"\\boxed{{{n}}}")[2]]
    assert len(hits) == 1


def test_tool_use_env_through_gym(jailed):
    env = jailed(TOOLS)
    obs, info = env.reset(seed=0)
    assert env.domain == "tool_use" and obs.startswith("Request 1 of 2")
    assert info["tools"][0]["function"]["name"] == "add"
    for action in ['<tool_call>{"name": "add", "arguments": {"n": 3}}</tool_call>',
                   '<tool_call>{"name": "add", "arguments": {"n": 2}}</tool_call>']:
        env.step(action)
    obs, reward, terminated, truncated, info = env.step("<answer>done</answer>")
    assert (reward, terminated) == (1.0, True)


# a tool-use env that pays its progress fraction (0.25 a request) on every call, with a free read
FOUR_REQUESTS = '''
class FourRequestsEnv(ToolUseBaseEnv):
    max_turns = 20

    def setup(self):
        number = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        self.tools = {"add": {"description": "add n", "parameters": number},
                      "read": {"description": "the total", "parameters": {"type": "object",
                                                                          "properties": {}}}}
        self.state = {"total": 0}
        self.instructions = [f"Make the total {t}." for t in (1, 2, 3, 4)]
        self.criteria = [lambda s, t=t: s["total"] >= t for t in (1, 2, 3, 4)]

    def tool_add(self, n):
        self.state["total"] += int(n)
        return f"total={self.state['total']}"

    def tool_read(self):
        return f"total={self.state['total']}"

    def solution(self):
        return ['<tool_call>{"name": "add", "arguments": {"n": 1}}</tool_call>'] * 4 + [
            "<answer>done</answer>"]
'''
ADD_ONE = '<tool_call>{"name": "add", "arguments": {"n": 1}}</tool_call>'
READ = '<tool_call>{"name": "read", "arguments": {}}</tool_call>'


def episode_return(env: gymnasium.Env, policy) -> tuple[float, list[float], bool]:
    """Play one episode to its end; (return, the env's own rewards, terminated)."""
    env.reset(seed=0)
    total, env_rewards = 0.0, []
    for turn in range(1000):
        obs, reward, terminated, truncated, info = env.step(policy(turn))
        total += reward
        env_rewards.append(info["env_reward"])
        if terminated or truncated:
            return total, env_rewards, terminated
    raise AssertionError("the time limit never ended the episode")


def test_returns_are_outcome_only_so_repeating_a_read_earns_nothing(nsjail_ok):
    env_id = unique_id("FourRequests")
    assert register(env_id, FOUR_REQUESTS, SANDBOX) == 20
    env = gymnasium.make(env_id)
    try:
        stall = episode_return(env, lambda turn: ADD_ONE if turn < 3 else READ)
        solve = episode_return(env, lambda turn: ADD_ONE if turn < 4 else "<answer>done</answer>")
    finally:
        env.close()
    stall_return, stall_env_rewards, stall_won = stall
    # the env itself paid 0.75 on each of 17 reads: summed, that was the exploit
    assert len(stall_env_rewards) == 20 and stall_env_rewards[3:] == [0.75] * 17
    assert (stall_return, stall_won) == (0.0, False)
    assert solve == (1.0, [0.25, 0.5, 0.75, 1.0, 1.0], True)


def test_register_and_make_truncate_at_max_turns(nsjail_ok):
    env_id = unique_id("Endless")
    assert register(env_id, ENDLESS, SANDBOX) == 4
    assert gymnasium.spec(env_id).max_episode_steps == 4
    env = gymnasium.make(env_id)
    try:
        obs, info = env.reset(seed=0)
        assert obs == "start"
        flags = [env.step(f"a{i}")[2:4] for i in range(4)]
        assert flags == [(False, False)] * 3 + [(False, True)]
        env.reset(seed=1)  # a new episode starts the count again
        assert env.step("again")[0] == "step 1: again"
    finally:
        env.close()


def test_register_without_max_turns_uses_the_cap(nsjail_ok):
    source = ENDLESS.replace("    max_turns = 4\n", "")
    assert register(unique_id("NoTurns"), source, SANDBOX) == 25
    assert register(unique_id("Override"), source, SANDBOX, max_episode_steps=2) == 2


@pytest.mark.parametrize("env_reward,terminated,paid", [
    (5.0, True, 1.0), (-3.0, True, -1.0), (-0.5, True, -0.5), (0.9, False, 0.0)])
def test_step_pays_the_clipped_reward_only_on_termination(jailed, env_reward, terminated, paid):
    env = jailed(hostile(f"return 'obs', {env_reward}, {terminated}, False, {{}}"))
    env.reset(seed=0)
    obs, reward, done, truncated, info = env.step("x")
    assert (reward, done, info) == (paid, terminated, {"env_reward": env_reward})


# -- failures ------------------------------------------------------------------------------------

def test_env_exception_is_envcrashed_and_env_survives(jailed):
    env = jailed(hostile("raise ValueError('bad move')"))
    env.reset(seed=0)
    with pytest.raises(EnvCrashed) as caught:
        env.step("x")
    assert caught.value.outcome == "program_error" and "bad move" in caught.value.message
    assert caught.value.error["type"] == "ValueError"
    assert env.reset(seed=0) == ("ok", {})


def test_timeout_is_envcrashed_and_sticky(jailed):
    env = jailed(hostile("while True: pass"))
    env.reset(seed=0)
    with pytest.raises(EnvCrashed) as caught:
        env.step("x")
    assert caught.value.outcome == "timeout"
    with pytest.raises(EnvCrashed) as again:
        env.reset(seed=0)
    assert again.value.outcome == "timeout"


@pytest.mark.parametrize("step,outcome", [
    ("return 42, 0.0, False, False, {}", "program_error"),
    ("return 'obs', 'lots', False, False, {}", "program_error"),
    ("return 'obs', float('nan'), False, False, {}", "program_error"),
    ("return 'obs', 0.0, 0, False, {}", "program_error"),
    ("return 'obs', 0.0, False, False, []", "program_error"),
    ("return 'obs', 0.0, False", "program_error"),
    ("return 'x' * (10 << 20), 0.0, False, False, {}", "output_limit"),
    ("os._exit(1)", "program_error"),
])
def test_bad_replies_are_envcrashed(jailed, step, outcome):
    env = jailed(hostile(step))
    env.reset(seed=0)
    with pytest.raises(EnvCrashed) as caught:
        env.step("x")
    assert caught.value.outcome == outcome, caught.value


def test_source_that_does_not_load_is_envcrashed(nsjail_ok):
    with pytest.raises(EnvCrashed) as caught:
        JailedEnv("class Broken(:\n", SANDBOX)
    assert caught.value.outcome == "program_error"
    with pytest.raises(EnvCrashed):
        JailedEnv("x = 1\n", SANDBOX)  # no class ending in Env


def test_non_str_action_is_typeerror_and_close_is_idempotent(jailed):
    env = jailed()
    env.reset(seed=0)
    with pytest.raises(TypeError):
        env.step(3)
    env.close()
    env.close()
    with pytest.raises(EnvCrashed):
        env.reset(seed=0)


def test_render_modes_are_empty(jailed):
    env = jailed()
    assert env.metadata["render_modes"] == [] and env.render_mode is None
    assert env.render() is None
    with pytest.raises(ValueError):
        JailedEnv(GUESS, SANDBOX, render_mode="human")
