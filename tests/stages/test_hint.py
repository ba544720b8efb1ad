"""hint: cleaned text lands in the env record; the env keeps its id; a hint that plays to a
win on its own is written again, then marked; an env that stalls the check cannot pay."""

import time
from pathlib import Path

import pytest

from sandbox.jail import Limits, Sandbox
from stages import hint as stage
from stages import leaks, seed_library
from stages.backends.scripted import ScriptedBackend
from stages.records import Env
from stages.shards import read
from stages.validate import source_hash


def test_hint_is_written_without_changing_the_env_id():
    envs = list(read([str(seed_library.ENV_SHARD)]))[:3]
    seen = []

    def respond(messages, tools):
        seen.append(messages[0]["content"])
        return "**Hint:** push crates only from the side facing the target.\n```python\nx=1\n```"

    hinted = list(stage.run(envs, ScriptedBackend(respond), stage.Config()))
    assert [e.id for e in hinted] == [e.id for e in envs]
    assert all(e.hint == "push crates only from the side facing the target." for e in hinted)
    assert envs[0].source in seen[0]
    assert hinted[0].meta["hint"]["completion_ids"]


def test_tool_use_envs_get_the_value_free_prompt():
    envs = [e for e in read([str(seed_library.ENV_SHARD)]) if e.domain == "tool_use"][:1]
    prompts_seen = []
    list(stage.run(envs, ScriptedBackend(lambda m, t: prompts_seen.append(m) or "plan"),
                   stage.Config()))
    assert "placeholders such as <order_id>" in prompts_seen[0][0]["content"]


def test_empty_hint_stays_none():
    assert stage.clean("```python\nprint(1)\n```", 100) is None
    assert stage.clean("Hint: " + "x" * 50, 10) == "x" * 10


# Three colours, three guesses: a hint that lists the colours gives the game away.
COLOURS = '''
import random
import re
class ColourEnv:
    max_turns = 3
    def reset(self, seed=None):
        self.colour = random.Random(seed).choice(["red", "green", "blue"])
        return "Guess my colour as \\\\boxed{colour}; the clue: it is not yellow.", {}
    def step(self, action):
        m = re.findall(r"\\\\boxed\\{(.*?)\\}", action)
        if m and m[-1].strip() == self.colour:
            return "Right.", 1.0, True, False, {}
        return "No.", 0.0, False, False, {}
    def solution(self):
        return ["\\\\boxed{%s}" % self.colour]
'''
LEAK = "It is one of 'red', 'green' or \\boxed{blue}; try them in turn."
STRATEGY = "Think about which colour the clue leaves out."


def colour_env():
    return Env(domain="game", class_name="ColourEnv", source=COLOURS,
               source_hash=source_hash(COLOURS), max_turns=3,
               meta={"validation": {"seeds": list(range(8))}})


def test_hint_actions_are_what_the_text_names_in_order():
    assert leaks.hint_actions(LEAK, "game") == ["\\boxed{red}", "\\boxed{green}", "\\boxed{blue}"]
    assert leaks.hint_actions('Halve the range: start at 500, then "250"', "game") == [
        "\\boxed{500}", "\\boxed{250}"]
    assert leaks.hint_actions("Answer `42` after 2 lookups", "tool_use") == [
        "<answer>42</answer>", "<answer>2</answer>"]
    assert leaks.hint_actions(STRATEGY, "game") == []


@pytest.mark.parametrize("hint", [
    "The code is four thousand two hundred.",
    "Multiply six hundreds by seven: 6 x 700.",
    "Decode NDIwMA== and type it.",
    "Hex tells: 0x1068.",
    "In hex, 34323030 spells it.",
])
def test_an_answer_written_in_other_words_is_read_as_the_answer(hint):
    assert "\\boxed{4200}" in leaks.hint_actions(hint, "game")


def test_prose_with_number_words_or_words_that_parse_as_base64_adds_no_noise():
    assert leaks.hint_actions("Think one step at a time, between the clues.", "game") == []
    assert leaks.hint_actions("It is 0x10, not 0 x 10.", "game")[0] == "\\boxed{16}"


def test_a_hint_that_plays_to_a_win_on_its_own_leaks(nsjail_ok):
    leaked = leaks.check(colour_env().model_copy(update={"hint": LEAK}), Sandbox())
    assert leaked["leaks"] and leaked["won"] == leaked["seeds"] == 8
    kept = leaks.check(colour_env().model_copy(update={"hint": "Not 'red'."}), Sandbox())
    assert not kept["leaks"] and kept["won"] <= 4  # red wins the seeds that hid red


def test_a_leaking_hint_is_written_again_and_marked_when_it_keeps_leaking(nsjail_ok):
    replies = iter([LEAK, STRATEGY])
    (fixed,) = stage.run([colour_env()], ScriptedBackend(lambda m, t: next(replies)),
                         stage.Config())
    assert fixed.hint == STRATEGY and not leaks.leaking(fixed)
    assert fixed.meta["hint"]["leak"]["attempts"] == 2
    (stubborn,) = stage.run([colour_env()], ScriptedBackend(lambda m, t: LEAK),
                            stage.Config(attempts=3))
    assert stubborn.hint == LEAK and leaks.leaking(stubborn)
    assert stubborn.meta["hint"]["leak"]["attempts"] == 3
    assert stubborn.id == colour_env().id


STALLS = Path(__file__).parents[1] / "adversarial" / "programs" / "hostage_first_episode_stalls.py"


def stalling_env():
    """Stalls just under a 2 s call timeout on any action but its solution's, in its jail's
    first episode: the leak check's first seed."""
    source = STALLS.read_text()
    return Env(domain="game", class_name="VaultEnv", source=source,
               source_hash=source_hash(source), max_turns=8,
               meta={"validation": {"seeds": list(range(5))}})


def test_an_env_that_stalls_the_leak_check_cannot_pay_and_the_stage_goes_on(nsjail_ok):
    cfg = stage.Config(env_budget=1.0, sandbox=Sandbox(limits=Limits(call_timeout=2)))
    hint = "Try 'open 123' first, then 'red'."
    started = time.monotonic()
    stalled, fair = stage.run([stalling_env(), colour_env()],
                              ScriptedBackend(lambda m, t: hint), cfg)
    assert time.monotonic() - started < 10  # one budget for the stalling env, not 5 seeds' turns
    verdict = stalled.meta["hint"]["leak"]
    assert verdict["leaks"] and verdict["stalled"] == "env_budget" and verdict["won"] == 0
    assert verdict["attempts"] == 1  # not written again: a new hint meets the same env
    assert verdict["error"].startswith("resources: env_budget during leak (step): the env used "
                                       "its 1s budget")
    assert leaks.leaking(stalled) and leaks.stalled(stalled)
    assert fair.hint == hint and not leaks.leaking(fair) and not leaks.stalled(fair)


FIRST_EPISODE_HONEST = '''
import random, re
class TwoFacedEnv:
    max_turns = 3
    episodes = 0
    def reset(self, seed=None):
        TwoFacedEnv.episodes += 1
        self.secret = str(random.Random(seed).randint(10**5, 10**6))
        return "Guess the number as \\\\boxed{N}.", {}
    def step(self, action):
        m = re.search(r"\\\\boxed\\{(.*?)\\}", action)
        won = m is not None and (m.group(1) == self.secret or
                                 (m.group(1) == "7" and TwoFacedEnv.episodes == 1))
        return ("Right." if won else "Wrong."), float(won), won, False, {}
    def solution(self):
        return ["\\\\boxed{" + self.secret + "}"]
'''


def test_the_leak_check_plays_each_seed_in_a_fresh_worker_as_a_play_is(nsjail_ok):
    """An env that pays the hint's answer only in a worker's first episode, as every play is,
    leaks on every seed: one worker reset many times would have seen it pay once."""
    env = Env(domain="game", class_name="TwoFacedEnv", source=FIRST_EPISODE_HONEST,
              source_hash=source_hash(FIRST_EPISODE_HONEST), max_turns=3, hint="Answer \"7\" now",
              meta={"validation": {"seeds": [1, 2, 3, 4, 5]}})
    verdict = leaks.check(env, Sandbox())
    assert verdict["leaks"] and verdict["won"] == 5
