"""stages/trivial.py at its limits, without a jail: which blind policies and literals are played,
"more than half the seeds" (exactly half is not), play stopping once half the seeds are lost,
near misses (a two-sided tolerance fails, one side does not, a seed the control wins is not
graded), the caps on plays, steps and time, and the chance level. The env runs in this process
behind a stand-in for the jailed worker (tests/sandbox/env_worker.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sandbox import contract
from sandbox.contract import ContractError, EnvFacts, Probe, Solved
from sandbox.jail import Limits, Sandbox
from stages import trivial
from tests.sandbox.env_worker import EnvWorker, GuessEnv, Jail
from tests.sandbox.tiny_env import GAME

SEEDS = [2, 3, 5, 6, 7]  # digits the generic actions (\boxed{0}, \boxed{1}) never guess


def rejected(call, *args):
    with pytest.raises(ContractError) as raised:
        call(*args)
    return raised.value


def plays_on(env, seconds=60.0, seeds=len(SEEDS)):
    return trivial.Plays(Probe(EnvWorker(env)), seeds, seconds)


def solved(seeds, env_class=GuessEnv):
    env = env_class()
    return {seed: Solved(list(env.reset(seed)), env.solution()) for seed in seeds}


def facts(oracle=True, max_turns=3):
    return EnvFacts("GuessEnv", "game", max_turns, oracle=oracle)


def wins_also(action, answers=None):
    """GuessEnv where `action` wins too (where the seed's digit is in `answers`, when given)."""

    class Env(GuessEnv):
        def step(self, sent):
            if sent == action and (answers is None or self.answer in answers):
                self.turns += 1
                return "yes", 1.0, True, False, {}
            return super().step(sent)

    return Env()


# -- the policies --------------------------------------------------------------------------------

def test_a_game_plays_the_fixed_texts_the_echoes_and_each_boxed_generic_action_once():
    names = [name for name, _ in trivial.blind_policies("game")]
    boxed = [a for a in contract.GENERIC_ACTIONS if a.startswith("\\boxed{")]
    assert names == ["plain prose", "a refusal", '"I don\'t know"', "\\boxed{}", "\\boxed{",
                     "\\boxed{}}", "echoing the observation", "echoing the first observation",
                     *boxed[1:]]
    policy = dict(trivial.blind_policies("game"))
    assert policy["plain prose"](0, "obs", "first") == trivial.PROSE
    assert policy["\\boxed{"](4, "obs", "first") == "\\boxed{"
    assert policy["echoing the observation"](2, "obs", "first") == "obs"
    assert policy["echoing the first observation"](2, "obs", "first") == "first"


def test_each_fixed_policy_plays_the_text_its_name_says_every_turn():
    texts = {name: policy(5, "obs", "first") for name, policy in trivial.blind_policies("game")
             if not name.startswith("echoing")}
    said = {"plain prose": trivial.PROSE, "a refusal": trivial.REFUSAL,
            '"I don\'t know"': trivial.UNKNOWN}
    assert texts == {name: said.get(name, name) for name in texts}


def test_a_tool_use_env_plays_an_answer_of_not_knowing_and_its_own_generic_actions():
    names = [name for name, _ in trivial.blind_policies("tool_use")]
    assert names[8] == "<answer>I don't know</answer>"
    assert names[9:] == ['<tool_call>{"name": "help", "arguments": {}}</tool_call>',
                         "<answer>done</answer>"]
    assert dict(trivial.blind_policies("tool_use"))[names[8]](0, "", "") == \
        "<answer>I don't know.</answer>"


def test_literals_become_actions_of_the_envs_kind_and_ones_already_played_are_skipped():
    source = 'A = ["north", "\\\\boxed{7}", "<answer>x</answer>", "north ", "b"]\n'
    game = trivial.literal_policies("game", source, {"\\boxed{b}"})
    assert [name for name, _ in game] == ["\\boxed{north}", "\\boxed{7}", "<answer>x</answer>"]
    assert game[0][1](3, "obs", "first") == "\\boxed{north}"
    tool_use = trivial.literal_policies("tool_use", source, set())
    assert [name for name, _ in tool_use] == ["<answer>b</answer>", "<answer>north</answer>",
                                              "\\boxed{7}", "<answer>x</answer>"]


@pytest.mark.parametrize("text,kept", [
    ("x" * 40, True), ("x" * 41, False), ("one two three", True), ("one two three four", False),
    ("a_b", True), ("_", False), ("--", False), ("7", True), ("two\nlines", False)])
def test_a_literal_is_an_action_when_short_of_few_words_and_with_a_letter_or_digit(text, kept):
    assert trivial.literals(f"X = {text!r}\n") == ([text] if kept else [])


def test_literals_of_one_length_keep_their_order_in_the_source():
    assert trivial.literals('A = "bb"\nB = "aa"\nC = ("dd", "cc")\n') == ["bb", "aa", "dd", "cc"]


# -- near misses ---------------------------------------------------------------------------------

def test_the_first_three_numbers_of_the_final_answer_are_missed_and_the_fourth_is_not():
    misses = trivial.near_misses("\\boxed{1 2 3 4}")
    assert misses["number 3 +1"] == "\\boxed{1 2 4 4}"
    assert misses["number 1 -1"] == "\\boxed{0 2 3 4}"
    assert not any(name.startswith("number 4") for name in misses)


@pytest.mark.parametrize("value,two_percent", [(50, True), (49, False), (-50, True), (5.0, True),
                                               (4.9, False)])
def test_two_percent_is_missed_only_where_it_is_a_unit_of_the_last_digit_or_more(value,
                                                                                  two_percent):
    misses = trivial.near_misses(f"\\boxed{{{value}}}")
    assert ("number 1 +2%" in misses) is two_percent and ("number 1 -2%" in misses) is two_percent


def test_the_percent_misses_are_exact_at_the_answers_precision():
    assert trivial.near_misses("\\boxed{5.5}")["number 1 -2%"] == "\\boxed{5.390}"
    assert trivial.near_misses("\\boxed{-50}")["number 1 -2%"] == "\\boxed{-49.00}"


def test_a_near_miss_changes_the_last_box_only_and_moves_z_to_a():
    assert trivial.near_misses("\\boxed{9} then \\boxed{cat dog}") == {
        "one letter changed": "\\boxed{9} then \\boxed{cat eog}"}
    assert trivial.near_misses("<answer>Zoo</answer>") == {
        "one letter changed": "<answer>Aoo</answer>"}
    assert trivial.near_misses("\\boxed{az}") == {"one letter changed": "\\boxed{bz}"}


def test_a_tool_call_is_missed_in_its_numbers_and_controlled_by_an_unknown_tool():
    call = '<tool_call>{"name": "pay", "arguments": {"amount": 7}}</tool_call>'
    assert trivial.near_misses(call) == {
        "number 1 -1": call.replace("7", "6"), "number 1 +1": call.replace("7", "8")}
    assert trivial.control("say <answer>Paris</answer>") == "say <answer>zzz</answer>"
    assert trivial.control(call) == '<tool_call>{"name": "zzz", "arguments": {}}</tool_call>'


# -- playing -------------------------------------------------------------------------------------

def test_an_episode_is_won_only_when_it_ends_with_a_positive_reward():
    plays = plays_on(GuessEnv())
    seen = []

    def policy(turn, obs, first):
        seen.append((turn, obs, first))
        return "\\boxed{9}" if turn < 2 else "\\boxed{3}"

    assert plays.episode(3, policy, 3) is True
    assert seen == [(0, "Guess my digit (3).", "Guess my digit (3)."),
                    (1, "no", "Guess my digit (3)."), (2, "no", "Guess my digit (3).")]
    assert plays.episode(3, policy, 2) is False  # out of turns
    assert plays_on(wins_also("\\boxed{9}")).episode(3, trivial.fixed("\\boxed{8}"), 5) is False
    assert (plays.count, plays.steps) == (2, 5)


def test_an_episode_ending_with_reward_0_is_lost():
    class PaysNothing(GuessEnv):
        def step(self, action):
            obs, _, terminated, truncated, info = super().step(action)
            return obs, 0.0, terminated, truncated, info

    plays = plays_on(PaysNothing())
    assert plays.episode(3, trivial.fixed("\\boxed{3}"), 3) is False
    assert plays.replay(3, [], "\\boxed{3}") is False


def test_a_replay_counts_only_when_its_last_action_ends_the_episode():
    plays = plays_on(GuessEnv())
    assert plays.replay(3, ["\\boxed{9}"], "\\boxed{3}") is True
    assert plays.replay(3, ["\\boxed{3}"], "\\boxed{9}") is None  # the prefix already won
    assert plays.replay(3, ["\\boxed{9}"] * 2, "\\boxed{9}") is False  # truncated at the last
    assert plays.replay(3, [], "\\boxed{9}") is False  # still open
    assert (plays.count, plays.steps) == (4, 7)


def test_the_play_cap_is_a_trivial_reject_naming_it():
    plays = plays_on(GuessEnv(), seeds=1)
    plays.count = trivial.MAX_PLAYS_PER_SEED
    err = rejected(plays.start_episode)
    assert (err.check, plays.capped) == ("trivial", "plays")
    assert f"{trivial.MAX_PLAYS_PER_SEED}-play cap" in err.msg


def test_the_step_cap_is_a_trivial_reject_and_scales_with_the_seeds():
    plays = plays_on(GuessEnv(), seeds=2)
    plays.steps = 2 * trivial.MAX_STEPS_PER_SEED
    err = rejected(plays.step, "\\boxed{3}")
    assert (err.check, plays.capped) == ("trivial", "steps")
    assert f"{2 * trivial.MAX_STEPS_PER_SEED}-step cap" in err.msg


def test_the_time_cap_is_a_resources_reject(monkeypatch):
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(trivial, "time", SimpleNamespace(monotonic=lambda: clock.now))
    plays = plays_on(GuessEnv(), seconds=10)
    clock.now = 110.5
    err = rejected(plays.step, "\\boxed{3}")  # past the deadline: no call reaches the env
    assert (err.check, err.outcome, plays.capped) == ("resources", "timeout", "time")


# -- "more than half the seeds" ------------------------------------------------------------------

def blind(env, policies, seeds=SEEDS, oracle=True, max_turns=3):
    tally = {}
    trivial.check_blind(plays_on(env), facts(oracle, max_turns), solved(seeds), policies, tally)
    return tally


def test_a_policy_that_wins_exactly_half_the_seeds_is_not_a_shortcut():
    yes = [("\\boxed{yes}", trivial.fixed("\\boxed{yes}"))]
    assert blind(wins_also("\\boxed{yes}", {2, 3}), yes, SEEDS[:4]) == {"\\boxed{yes}": [2, 4]}
    err = rejected(blind, wins_also("\\boxed{yes}", {2, 3, 5}), yes, SEEDS[:5])
    assert (err.check, err.msg) == ("trivial", "\\boxed{yes} every turn wins 3 of 5 seeds (seeds "
                                    "with different answers: a shortcut, not a game)")


def test_play_of_a_policy_stops_once_half_its_seeds_are_lost():
    yes = [("\\boxed{yes}", trivial.fixed("\\boxed{yes}"))]
    assert blind(GuessEnv(), yes, SEEDS[:4]) == {"\\boxed{yes}": [0, 2]}
    assert blind(GuessEnv(), yes, SEEDS[:5]) == {"\\boxed{yes}": [0, 3]}
    assert blind(wins_also("\\boxed{yes}", {6, 7}), yes, SEEDS) == {"\\boxed{yes}": [0, 3]}


def test_a_policy_winning_only_seeds_with_one_answer_is_a_lucky_guess():
    yes = [("\\boxed{yes}", trivial.fixed("\\boxed{yes}"))]
    assert blind(wins_also("\\boxed{yes}", {2}), yes, [2, 12, 22, 3]) == {"\\boxed{yes}": [3, 4]}


def test_without_solutions_the_seeds_won_are_told_apart_by_their_first_observation():
    yes = [("\\boxed{yes}", trivial.fixed("\\boxed{yes}"))]
    err = rejected(blind, wins_also("\\boxed{yes}", {2}), yes, [2, 12, 22], False)
    assert err.msg.startswith("\\boxed{yes} every turn wins 3 of 3 seeds")


def test_an_echo_wins_without_an_every_turn_and_each_policy_plays_the_envs_turns():
    class EchoPays(GuessEnv):  # on the second turn
        def step(self, action):
            if action.startswith("Guess my digit") and self.turns == 1:
                return "yes", 1.0, True, False, {}
            return super().step(action)

    echo = [p for p in trivial.blind_policies("game") if p[0] == "echoing the first observation"]
    err = rejected(blind, EchoPays(), echo)
    assert err.msg.startswith("echoing the first observation wins 5 of 5 seeds")
    assert blind(EchoPays(), echo, max_turns=1) == {"echoing the first observation": [0, 3]}


def test_blind_play_past_the_play_cap_is_a_reject_not_a_partial_tally():
    plays = plays_on(GuessEnv())
    plays.count = plays.max_plays
    err = rejected(trivial.check_blind, plays, facts(), solved(SEEDS),
                   [("x", trivial.fixed("x"))], {})
    assert (err.check, plays.capped) == ("trivial", "plays")


# -- near misses on an env -----------------------------------------------------------------------

class WithinOneEnv(GuessEnv):
    """Any number within `tolerance` of the answer wins; a two-digit answer, so misses exist."""

    low, high = 1, 1

    def reset(self, seed=None):
        obs, info = super().reset(seed)
        self.answer += 10
        return obs, info

    def step(self, action):
        self.turns += 1
        wins = {f"\\boxed{{{self.answer + d}}}" for d in range(-self.low, self.high + 1)}
        return ("yes", 1.0, True, False, {}) if action in wins else \
            ("no", 0.0, False, self.turns >= self.max_turns, {})


def near(env, seeds=SEEDS):
    tally = {}
    episodes = solved(seeds, type(env))
    trivial.check_near_misses(plays_on(env), facts(), episodes, tally)
    return tally


def test_a_two_sided_tolerance_around_the_answer_fails_the_env():
    class NotAboveSeven(WithinOneEnv):
        def reset(self, seed=None):
            out = super().reset(seed)
            self.high = int(seed != 7)
            return out

    err = rejected(near, NotAboveSeven())
    assert (err.check, err.msg) == ("trivial", "near misses of the solution's final answer win: "
                                    "number 1 -1 wins 5 and number 1 +1 wins 4 of 5 seeds (a "
                                    "tolerance, not the answer)")


def test_one_side_of_the_answer_winning_is_a_threshold_not_a_tolerance():
    at_least = type("AtLeast", (WithinOneEnv,), {"low": 0})()
    assert near(at_least) == {"near miss: number 1 -1": [0, 3], "near miss: number 1 +1": [5, 5]}
    exact = type("Exact", (WithinOneEnv,), {"low": 0, "high": 0})()
    assert near(exact, SEEDS[:4]) == {"near miss: number 1 -1": [0, 2],  # half lost: stop
                                      "near miss: number 1 +1": [0, 2]}


def test_a_tolerance_that_wins_exactly_half_the_seeds_passes():
    class HalfTolerant(WithinOneEnv):
        def reset(self, seed=None):
            out = super().reset(seed)
            self.low = self.high = int(seed < 4)
            return out

    assert near(HalfTolerant(), SEEDS[:4]) == {"near miss: number 1 -1": [2, 4],
                                               "near miss: number 1 +1": [2, 4]}


def test_a_changed_letter_that_wins_most_seeds_fails_the_env():
    class FirstLetterFree(GuessEnv):
        def reset(self, seed=None):
            out = super().reset(seed)
            self.word = ["cat", "dog", "owl", "bee", "elk", "ant", "fox", "yak"][seed % 8]
            return out

        def step(self, action):
            self.turns += 1
            if action[8:-1] == self.word[1:] and action.startswith("\\boxed{"):
                return "yes", 1.0, True, False, {}
            return "no", 0.0, False, self.turns >= self.max_turns, {}

        def solution(self):
            return [f"\\boxed{{{self.word}}}"]

    err = rejected(near, FirstLetterFree(), SEEDS[:3])
    assert err.check == "trivial" and err.msg == ("near misses of the solution's final answer win: one letter changed wins "
                       "3 of 3 seeds")


def test_a_seed_the_control_wins_is_not_graded():
    class AnyAnswerOnSome(WithinOneEnv):  # scored on its state on three seeds: any answer wins
        low = high = 0

        def step(self, action):
            if self.answer in (12, 13, 15):
                return "yes", 1.0, True, False, {}
            return super().step(action)

    assert near(AnyAnswerOnSome()) == {"near miss: number 1 -1": [0, 2],
                                       "near miss: number 1 +1": [0, 2]}


class KeypadEnv(WithinOneEnv):
    """`\\boxed{go}` first, then the number: only after go is an answer graded; on the seeds
    in `any_answer` it is scored on its state, so any answer after go wins."""

    any_answer = ()

    def step(self, action):
        if self.turns == 0:
            self.turns += 1
            return "go on", 0.0, False, action != "\\boxed{go}", {}
        if self.answer - 10 in self.any_answer:
            return "yes", 1.0, True, False, {}
        return super().step(action)

    def solution(self):
        return ["\\boxed{go}", f"\\boxed{{{self.answer}}}"]


def test_near_misses_and_the_control_are_played_after_the_solutions_other_actions():
    assert rejected(near, KeypadEnv()).msg.startswith("near misses of the solution's final "
                                                      "answer win: number 1 -1 wins 5")
    state_scored = type("StateScored", (KeypadEnv,), {"low": 0, "high": 0, "any_answer": (2, 3, 5)})
    assert near(state_scored()) == {"near miss: number 1 -1": [0, 2],
                                    "near miss: number 1 +1": [0, 2]}


def test_near_misses_of_a_solution_that_wins_before_its_last_action_are_not_played():
    class Early(WithinOneEnv):
        def solution(self):
            return [f"\\boxed{{{self.answer}}}", "\\boxed{0}"]

    assert near(Early()) == {"near miss: number 1 -1": [0, 3], "near miss: number 1 +1": [0, 3]}


# -- the chance level ----------------------------------------------------------------------------

def test_chance_is_the_mean_share_of_the_other_seeds_solutions_that_win_each_seed():
    plays = plays_on(GuessEnv())
    # seeds 2 and 12 hide 2, seed 3 hides 3: 1/2, 1/2 and 0 of the others' solutions win
    assert trivial.chance_level(plays, solved([2, 12, 3]), 3) == 0.3333
    assert plays.count == 5  # seed 3 replays the one distinct solution the others share once


def test_chance_needs_two_seeds_with_solutions_and_plays_a_solution_within_the_turns():
    episodes = solved([2, 3])
    assert trivial.chance_level(plays_on(GuessEnv()), {2: episodes[2]}, 3) is None
    assert trivial.chance_level(plays_on(GuessEnv()), {**episodes, 4: Solved([], None)}, 3) == 0.0
    long = {seed: Solved([], ["\\boxed{9}", "\\boxed{2}"]) for seed in (2, 12)}
    assert trivial.chance_level(plays_on(GuessEnv()), long, 2) == 1.0
    assert trivial.chance_level(plays_on(GuessEnv()), long, 1) == 0.0


# -- the whole check -----------------------------------------------------------------------------

@pytest.fixture
def jail(monkeypatch):
    """`jail(make_env)`: trivial's worker and the solution worker play fresh envs in-process."""

    def install(make_env=GuessEnv):
        made = Jail(make_env)
        monkeypatch.setattr(trivial, "Worker", made)
        monkeypatch.setattr(contract, "Worker", made)
        return made

    return install


def test_a_game_whose_answer_is_the_seeds_passes_with_its_tally_and_chance(jail):
    made = jail()
    got = trivial.check(Sandbox(), GAME, SEEDS, facts())
    # 22 blind policies, 2 near misses of \boxed{digit}, GAME's literals "hi" and "ok" (its
    # "\boxed{1}" is a generic action already played), each lost 3 of 5 seeds and stopped;
    # 5 controls of one step; chance replays the 4 other solutions on each of the 5 seeds
    assert got == {"policies": 26, "plays": 24 * 3 + 5 + 2 * 3 + 20,
                   "steps": 24 * 3 * 3 + 5 + 2 * 3 + 20, "capped": None, "chance": 0.0,
                   "wins": {}}
    solver = [w for w in made.workers if "solution" in [op for op, _ in w.calls]]
    assert len(made.workers) == 2 and len(solver) == 1 and not solver[0].played("step")


def test_a_policy_that_wins_most_seeds_is_a_trivial_reject_carrying_the_tally(jail):
    jail(lambda: wins_also(trivial.PROSE))
    with pytest.raises(trivial.TrivialError) as raised:
        trivial.check(Sandbox(), GAME, SEEDS, facts())
    err = raised.value
    assert (err.check, err.msg) == ("trivial", "plain prose every turn wins 5 of 5 seeds (seeds "
                                    "with different answers: a shortcut, not a game)")
    assert err.tally == {"policies": 1, "plays": 5, "steps": 5, "capped": None, "chance": None,
                         "wins": {"plain prose": "5/5"}}


def test_both_workers_load_the_source_in_the_validations_sandbox(jail):
    made = jail()
    sandbox = Sandbox(limits=Limits(lifetime=60))
    trivial.check(sandbox, GAME, SEEDS, facts())
    assert made.sandboxes == [sandbox, sandbox]
    assert all(w.calls[0] == ("load", {"source": GAME}) for w in made.workers)


def test_an_env_that_raises_during_blind_play_is_a_trivial_reject_saying_so(jail):
    class HatesProse(GuessEnv):
        def step(self, action):
            if action == trivial.PROSE:
                raise ValueError("no essays")
            return super().step(action)

    jail(HatesProse)
    with pytest.raises(trivial.TrivialError) as raised:
        trivial.check(Sandbox(), GAME, SEEDS, facts())
    err = raised.value
    assert (err.check, err.msg, err.outcome) == ("trivial", "step raised ValueError: no essays",
                                                 "program_error")
    assert err.tally["plays"] == 1


TOOL_USE = ("class DeskEnv(ToolUseBaseEnv):\n    def setup(self):\n        self.door = 'open "
            "sesame'\n    def solution(self):\n        return []\n")


def test_a_tool_use_envs_literals_are_played_as_answers(jail):
    jail(lambda: wins_also("<answer>open sesame</answer>"))
    tool_use = EnvFacts("DeskEnv", "tool_use", 3)
    with pytest.raises(trivial.TrivialError, match="^trivial: <answer>open sesame</answer> every "
                                                   "turn wins 5 of 5 seeds"):
        trivial.check(Sandbox(), TOOL_USE, SEEDS, tool_use)


def test_a_near_miss_or_literal_that_wins_is_a_trivial_reject_too(jail):
    jail(WithinOneEnv)
    with pytest.raises(trivial.TrivialError) as raised:
        trivial.check(Sandbox(), GAME, SEEDS, facts())
    assert raised.value.tally["wins"] == {"near miss: number 1 -1": "5/5",
                                          "near miss: number 1 +1": "5/5"}
    jail(lambda: wins_also("\\boxed{ok}"))
    with pytest.raises(trivial.TrivialError, match=r"^trivial: \\boxed\{ok\} every turn wins"):
        trivial.check(Sandbox(), GAME, SEEDS, facts())


def test_an_env_without_solution_plays_no_near_misses_and_has_no_chance_level(jail):
    jail(WithinOneEnv)
    got = trivial.check(Sandbox(), GAME, SEEDS, facts(oracle=False))
    assert got["policies"] == 24 and got["chance"] is None


def test_a_bad_step_during_play_is_its_own_reject_not_trivial(jail):
    class PaysTwoForProse(GuessEnv):
        def step(self, action):
            return ("no", 2.0, False, False, {}) if action == trivial.PROSE else \
                super().step(action)

    jail(PaysTwoForProse)
    err = rejected(trivial.check, Sandbox(), GAME, SEEDS, facts())
    assert type(err) is ContractError and err.check == "step_types"
    reference = GAME.replace("class TinyEnv:\n", "class TinyEnv:\n    def __init__(self, "
                             "max_turns=10, **kwargs):\n        pass\n\n")
    assert trivial.check(Sandbox(), reference, SEEDS, facts())["capped"] is None  # may pay 10


def test_play_gets_a_third_of_the_jails_lifetime(jail, monkeypatch):
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(trivial, "time", SimpleNamespace(monotonic=lambda: clock.now))

    class OneSecondASTep(GuessEnv):
        def step(self, action):
            clock.now += 1.0
            return super().step(action)

    jail(OneSecondASTep)
    with pytest.raises(trivial.TrivialError) as err:  # a third of 30 s: 10 s of play
        trivial.check(Sandbox(limits=Limits(lifetime=30)), GAME, SEEDS, facts())
    assert err.value.check == "resources" and "its 10 s cap" in err.value.msg
